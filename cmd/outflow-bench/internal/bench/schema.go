package bench

import (
	"context"
	"database/sql"
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
	return schemaWith(ctx, dbURL, maxConns, nil, func(db *sql.DB) error {
		if _, err := migrations.Up(ctx, db); err != nil {
			return err
		}
		_, err := appmigrations.Up(ctx, db)
		return err
	})
}

// SchemaSets is [Schema] with the framework's migrations and sets, as a
// service other than the reference app migrates: no app tables. The
// pool's connections trace their queries with tracer when it is not nil.
func SchemaSets(ctx context.Context, dbURL string, maxConns int32, tracer pgx.QueryTracer, sets ...migrations.Set) (*pgxpool.Pool, func(), error) {
	return schemaWith(ctx, dbURL, maxConns, tracer, func(db *sql.DB) error {
		_, err := migrations.UpSets(ctx, db, migrations.Config{}, append([]migrations.Set{migrations.Framework()}, sets...)...)
		return err
	})
}

func schemaWith(ctx context.Context, dbURL string, maxConns int32, tracer pgx.QueryTracer, migrate func(*sql.DB) error) (*pgxpool.Pool, func(), error) {
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
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrate(db); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
