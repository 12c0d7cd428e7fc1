package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/migrations"
)

// Schema creates a migrated schema of its own in the database at dbURL and
// returns a pool on it and a function that drops it.
func Schema(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, func(), error) {
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to PostgreSQL (run `make services-up`): %w", err)
	}
	name := fmt.Sprintf("outflowbench_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		admin.Close(ctx)
		return nil, nil, fmt.Errorf("create schema: %w", err)
	}
	drop := func() {
		_, _ = admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
		admin.Close(context.WithoutCancel(ctx))
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		drop()
		return nil, nil, err
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		drop()
		return nil, nil, err
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	if _, err := appmigrations.Up(ctx, db); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
