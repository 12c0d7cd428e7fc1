package watermill_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/brokers/watermill"
	"github.com/outflow-dev/outflow/brokers/watermillpub"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

type orderPlaced struct {
	N int `json:"n"`
}

func (orderPlaced) EventType() string { return "order.placed" }

// Events committed to the outbox reach two handlers of a consumer.Worker
// (two consumer groups) through the real forwarder and the adapter, each
// event once per handler, each aggregate in version order: over
// watermill-sql, and over a persistent GoChannel.
func TestWorkerHandlesEventsThroughTheAdapter(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  func(t *testing.T, s *outflowtest.Schema) watermill.Config
	}{
		{"watermill-sql", func(t *testing.T, s *outflowtest.Schema) watermill.Config { return sqlConfig(t, s.URL) }},
		{"gochannel", func(t *testing.T, _ *outflowtest.Schema) watermill.Config {
			gc := persistent(t)
			return watermill.Config{Publish: watermillpub.Config{Publisher: gc}, Subscriber: gc}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			workerEndToEnd(t, tt.cfg)
		})
	}
}

func workerEndToEnd(t *testing.T, config func(t *testing.T, s *outflowtest.Schema) watermill.Config) {
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE handled (
		id bigserial PRIMARY KEY, consumer text NOT NULL, message_id text NOT NULL, aggregate text NOT NULL, version bigint NOT NULL,
		UNIQUE (consumer, message_id))`); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, config(t, s))
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))

	reg := events.NewRegistry()
	if err := reg.Register(orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: s.Pool, Broker: b, Registry: reg, Logger: logger,
		ClaimIdle: 5 * time.Second, Idempotency: idempotency.Config{
			RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
			RetryPollInterval: 10 * time.Millisecond, GapRetryDelay: 50 * time.Millisecond,
		}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"projection", "mailer"} {
		if err := w.Add(consumer.Handler{Name: name, Topic: "orders", Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO handled (consumer, message_id, aggregate, version) VALUES ($1, $2, $3, $4)`,
				name, ev.MessageID, ev.AggregateID, ev.AggregateVersion)
			return err
		}}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(wctx) }()
	t.Cleanup(func() {
		stopWorker()
		if err := <-workerDone; err != nil {
			t.Errorf("worker: %v", err)
		}
	})

	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "orders"}})
	if err != nil {
		t.Fatal(err)
	}
	const aggregates, versions = 5, 8
	for v := range versions {
		if err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			for a := range aggregates {
				ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: fmt.Sprint("order-", a), Version: int64(v + 1)}, orderPlaced{N: v})
				if err != nil {
					return err
				}
				if err := writer.PublishTx(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := forwarder.New(forwarder.Config{Pool: s.Pool, Broker: b.Broker(), Logger: logger,
		PollInterval: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		OutageBackoffMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fctx, stopForwarder := context.WithCancel(ctx)
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- f.Run(fctx) }()
	t.Cleanup(func() {
		stopForwarder()
		if err := <-fwdDone; err != nil {
			t.Errorf("forwarder: %v", err)
		}
	})

	count := func(q string, args ...any) int {
		var n int
		if err := s.Pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	outflowtest.WaitFor(t, 60*time.Second, "both handlers to handle every event", func() bool {
		return count(`SELECT count(*) FROM handled`) == 2*aggregates*versions
	})
	// Each consumer's effects of an aggregate in version order: the
	// row ids grow with the versions.
	if n := count(`SELECT count(*) FROM (
		SELECT version, lag(version) OVER (PARTITION BY consumer, aggregate ORDER BY id) AS prev FROM handled) h
		WHERE version <> coalesce(prev, 0) + 1`); n != 0 {
		t.Fatalf("%d effects out of version order", n)
	}
}
