// Command payouts runs the example payouts service: its HTTP API, the
// forwarder that moves its outbox to Redis Streams, and its consumer, in
// one process, until SIGINT or SIGTERM.
//
//	payouts -database-url postgres://... -redis-url redis://... -addr :8090
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"golang.org/x/sync/errgroup"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/redis" // the one backend this service links
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/examples/payouts"
	"github.com/outflow-dev/outflow/forwarder"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "payouts:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payouts", flag.ContinueOnError)
	dbURL := fs.String("database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outflow?sslmode=disable"), "PostgreSQL URL")
	redisURL := fs.String("redis-url", envOr("REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (the broker)")
	addr := fs.String("addr", ":8090", "HTTP listen address")
	migrate := fs.Bool("migrate", true, "apply the migrations at start (false: a separate step ran them)")
	migrateOnly := fs.Bool("migrate-only", false, "apply the migrations and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" {
		return errors.New("-addr must not be empty")
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("-database-url: %w", err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if *migrate || *migrateOnly {
		if err := payouts.Migrate(ctx, db); err != nil {
			return err
		}
	}
	if *migrateOnly {
		return nil
	}

	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: *redisURL}, Logger: logger})
	if err != nil {
		return fmt.Errorf("-redis-url: %w", err)
	}
	defer backend.Close()

	fwd, err := forwarder.New(forwarder.Config{Pool: pool, Broker: backend.Broker(), Logger: logger})
	if err != nil {
		return err
	}
	registry, err := payouts.Registry()
	if err != nil {
		return err
	}
	worker, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: registry, Logger: logger})
	if err != nil {
		return err
	}
	if err := worker.Add(payouts.Balances()); err != nil {
		return err
	}
	writer, err := outbox.NewWriter(outbox.Config{Logger: logger})
	if err != nil {
		return err
	}
	svc := payouts.NewService(pool, writer, fwd.Wake)
	srv := &http.Server{Addr: *addr, Handler: svc.Handler(logger), ReadHeaderTimeout: 5 * time.Second}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return fwd.Run(gctx) })
	g.Go(func() error { return worker.Run(gctx) })
	g.Go(func() error {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("-addr %s: %w", *addr, err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), 10*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	logger.Info("payouts: serving", "addr", *addr)
	return g.Wait()
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
