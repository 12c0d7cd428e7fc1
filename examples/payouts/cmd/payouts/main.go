// Command payouts runs the example payouts service: its HTTP API, the
// forwarder that moves its outbox to Redis Streams, its consumers, and the
// sender of its merchants' webhooks, in one process, until SIGINT or
// SIGTERM.
//
//	payouts -database-url postgres://... -redis-url redis://... -addr :8090
//
// Merchants' API keys, for the webhook routes, are PAYOUTS_MERCHANT_KEYS
// ("key=merchant,key=merchant"); signing secrets are sealed at rest with
// OUTFLOW_SECRET_KEY when it is set.
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
	"strings"
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
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/sender"
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
	allowPrivate := fs.Bool("webhooks-allow-private", false, "let webhook endpoints be http and private addresses (development only)")
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

	keys, err := merchantKeys(os.Getenv("PAYOUTS_MERCHANT_KEYS"))
	if err != nil {
		return err
	}
	var sealKey *secretseal.Key
	if v := os.Getenv(secretseal.KeyEnv); v != "" {
		if sealKey, err = secretseal.ParseKey(v); err != nil {
			return fmt.Errorf("%s: %w", secretseal.KeyEnv, err)
		}
	}
	snd := sender.New(pool, sender.Config{SecretKey: sealKey, Render: payouts.RenderWebhook,
		AllowPrivate: *allowPrivate, Logger: logger})
	if err := worker.Add(payouts.WebhookFanout(snd.Wake)); err != nil {
		return err
	}
	store, err := endpoints.New(endpoints.Config{APIVersion: payouts.APIVersion, SecretKey: sealKey,
		AllowPrivate: *allowPrivate})
	if err != nil {
		return err
	}
	hooks, err := payouts.NewWebhookAPI(pool, store, snd.Wake, logger)
	if err != nil {
		return err
	}
	mux := svc.Handler(logger)
	payouts.MountWebhooks(mux, hooks, payouts.StaticKeys(keys))
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return fwd.Run(gctx) })
	g.Go(func() error { return worker.Run(gctx) })
	g.Go(func() error { return snd.Run(gctx) })
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

// merchantKeys reads "key=merchant,key=merchant". Its errors never quote
// a key.
func merchantKeys(v string) (map[string]string, error) {
	keys := map[string]string{}
	for i, kv := range strings.Split(v, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, m, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" || m == "" {
			return nil, fmt.Errorf("PAYOUTS_MERCHANT_KEYS: entry %d is not key=merchant", i+1)
		}
		keys[k] = m
	}
	return keys, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
