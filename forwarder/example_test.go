package forwarder_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/redis" // the Redis Streams backend
	"github.com/outflow-dev/outflow/forwarder"
)

// A forwarder of its own process: the outbox's database, a broker, and a
// graceful stop on SIGTERM (the batch in flight finishes first).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: os.Getenv("REDIS_URL")}, Logger: logger})
	if err != nil {
		panic(err)
	}
	defer backend.Close()

	fwd, err := forwarder.New(forwarder.Config{Pool: pool, Broker: backend.Broker(), Logger: logger})
	if err != nil {
		panic(err)
	}
	if err := fwd.Run(ctx); err != nil {
		panic(err)
	}
}

// Parked rows, the ones the broker refused MaxAttempts times, listed for an
// operator; RetryParked puts them back in line once the cause is fixed.
func ExampleListParked() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	parked, err := forwarder.ListParked(ctx, pool, 100)
	if err != nil {
		panic(err)
	}
	for _, r := range parked {
		slog.Info("parked", "id", r.ID, "aggregate_id", r.AggregateID, "error", r.LastError)
	}
}
