package watermillbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/brokers/watermillbackend"
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
		cfg  func(t *testing.T, s *outflowtest.Schema) watermillbackend.Config
	}{
		{"watermill-sql", func(t *testing.T, s *outflowtest.Schema) watermillbackend.Config { return sqlConfig(t, s.URL) }},
		{"gochannel", func(t *testing.T, _ *outflowtest.Schema) watermillbackend.Config {
			gc := persistent(t)
			return watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc}, Subscriber: gc}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, tt.cfg)
			r.startWorker("projection", "mailer")
			const aggregates, versions = 5, 8
			r.write(aggregates, 1, versions)
			r.startForwarder()
			outflowtest.WaitFor(t, 60*time.Second, "both handlers to handle every event", func() bool {
				return r.count(`SELECT count(*) FROM handled`) == 2*aggregates*versions
			})
			r.requireVersionOrder()
		})
	}
}

// Two workers, each a consumer group, share one GoChannel through one
// Backend: stopping one (which closes its subscribers) leaves the
// GoChannel to the other and to the forwarder, which go on.
func TestStoppingOneWorkerLeavesTheSharedGoChannel(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(t *testing.T, _ *outflowtest.Schema) watermillbackend.Config {
		gc := persistent(t)
		return watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc}, Subscriber: gc}
	})
	stopMailer := r.startWorker("mailer")
	r.startWorker("projection")
	r.write(3, 1, 2)
	r.startForwarder()
	outflowtest.WaitFor(t, 30*time.Second, "both workers to handle the first events", func() bool {
		return r.count(`SELECT count(*) FROM handled`) == 2*3*2
	})
	stopMailer()
	r.write(3, 3, 2)
	outflowtest.WaitFor(t, 30*time.Second, "the other worker to handle the events after the stop", func() bool {
		return r.count(`SELECT count(*) FROM handled WHERE consumer = 'projection'`) == 3*4
	})
	r.requireVersionOrder()
}

// rig is a schema with the outbox and a handled table, a backend, and the
// forwarder and workers the test starts, stopped when it ends.
type rig struct {
	t      *testing.T
	s      *outflowtest.Schema
	b      *watermillbackend.Backend
	reg    *events.Registry
	logger *slog.Logger
	writer *outbox.Writer
}

func newRig(t *testing.T, config func(t *testing.T, s *outflowtest.Schema) watermillbackend.Config) *rig {
	t.Helper()
	s := outflowtest.NewSchema(t)
	if _, err := s.Pool.Exec(context.Background(), `CREATE TABLE handled (
		id bigserial PRIMARY KEY, consumer text NOT NULL, message_id text NOT NULL, aggregate text NOT NULL, version bigint NOT NULL,
		UNIQUE (consumer, message_id))`); err != nil {
		t.Fatal(err)
	}
	reg := events.NewRegistry()
	if err := reg.Register(orderPlaced{}); err != nil {
		t.Fatal(err)
	}
	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "orders"}})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, s: s, b: newBackend(t, config(t, s)), reg: reg, writer: writer,
		logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
}

// startWorker runs a worker with a handler (a consumer group) of each name
// on "orders", recording each event it handles; stop stops it and waits.
func (r *rig) startWorker(names ...string) (stop func()) {
	r.t.Helper()
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: r.s.Pool, Broker: r.b, Registry: r.reg, Logger: r.logger,
		ClaimIdle: 5 * time.Second, Idempotency: idempotency.Config{
			RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
			RetryPollInterval: 10 * time.Millisecond, GapRetryDelay: 50 * time.Millisecond,
		}})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, name := range names {
		if err := w.Add(consumer.Handler{Name: name, Topic: "orders", Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO handled (consumer, message_id, aggregate, version) VALUES ($1, $2, $3, $4)`,
				name, ev.MessageID, ev.AggregateID, ev.AggregateVersion)
			return err
		}}); err != nil {
			r.t.Fatal(err)
		}
	}
	return r.run("worker", w.Run)
}

func (r *rig) startForwarder() {
	r.t.Helper()
	f, err := forwarder.New(forwarder.Config{Pool: r.s.Pool, Broker: r.b.Broker(), Logger: r.logger,
		PollInterval: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		OutageBackoffMax: 100 * time.Millisecond})
	if err != nil {
		r.t.Fatal(err)
	}
	r.run("forwarder", f.Run)
}

// run runs fn until stop is called or the test ends, and requires it to
// return nil.
func (r *rig) run(what string, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			r.t.Errorf("%s: %v", what, err)
		}
	}
	r.t.Cleanup(stop)
	return stop
}

// write commits, one transaction per version, versions from to
// from+n-1 of each of aggregates orders.
func (r *rig) write(aggregates, from, n int) {
	r.t.Helper()
	ctx := context.Background()
	for v := from; v < from+n; v++ {
		if err := pgx.BeginFunc(ctx, r.s.Pool, func(tx pgx.Tx) error {
			for a := range aggregates {
				ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: fmt.Sprint("order-", a), Version: int64(v)}, orderPlaced{N: v})
				if err != nil {
					return err
				}
				if err := r.writer.PublishTx(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *rig) count(q string, args ...any) int {
	r.t.Helper()
	var n int
	if err := r.s.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// requireVersionOrder requires each consumer's effects of an aggregate in
// version order, from 1: the row ids grow with the versions.
func (r *rig) requireVersionOrder() {
	r.t.Helper()
	if n := r.count(`SELECT count(*) FROM (
		SELECT version, lag(version) OVER (PARTITION BY consumer, aggregate ORDER BY id) AS prev FROM handled) h
		WHERE version <> coalesce(prev, 0) + 1`); n != 0 {
		r.t.Fatalf("%d effects out of version order", n)
	}
}
