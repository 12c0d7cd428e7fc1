package handlers_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/events/payment"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/forwarder/redisstreams"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/outflowtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// duplicatingBroker publishes every batch through the real broker, and the
// first few twice: the consumers see duplicates, as after a forwarder crash.
type duplicatingBroker struct {
	forwarder.Broker
	left atomic.Int32
}

func (d *duplicatingBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	if d.left.Add(-1) >= 0 {
		d.Broker.Publish(ctx, msgs)
	}
	return d.Broker.Publish(ctx, msgs)
}

type pipeline struct {
	schema  *outflowtest.Schema
	rdb     *redis.Client
	prefix  string
	svc     *app.Service
	backend brokers.Backend // nil: Redis at the test URL, streams under prefix
}

// testBackend opens one backend for a test, isolated (own stream, subject,
// queue or table names, deleted afterwards).
type testBackend struct {
	kind brokers.Kind
	open func(t *testing.T) brokers.Backend
}

// backends lists each backend the end-to-end suite runs on; files
// e2e_<kind>_test.go add theirs in init.
var backends = []testBackend{
	{brokers.Redis, func(t *testing.T) brokers.Backend {
		prefix := outflowtest.UniqueName(t, outflowtest.Redis(t)) + ":"
		return openBackend(t, brokers.Config{Kind: brokers.Redis, Partitions: 2,
			Redis: brokers.RedisConfig{URL: outflowtest.RedisURL(), StreamPrefix: prefix}})
	}},
	{brokers.NATS, func(t *testing.T) brokers.Backend {
		return openBackend(t, brokers.Config{Kind: brokers.NATS, Partitions: 2,
			NATS: brokers.NATSConfig{URL: outflowtest.NATSURL(), StreamPrefix: outflowtest.NATSPrefix(t)}})
	}},
}

func openBackend(t *testing.T, cfg brokers.Config) brokers.Backend {
	t.Helper()
	cfg.Logger = quiet
	b, err := brokers.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	p := &pipeline{schema: outflowtest.NewSchema(t), rdb: outflowtest.Redis(t)}
	p.prefix = outflowtest.UniqueName(t, p.rdb) + ":"
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	p.svc, err = app.NewService(app.Config{Pool: p.schema.Pool, Events: w})
	require.NoError(t, err)
	return p
}

func (p *pipeline) runForwarder(t *testing.T, dupBatches int32) {
	t.Helper()
	var b forwarder.Broker
	if p.backend != nil {
		b = p.backend.Broker()
	} else {
		rb, err := redisstreams.New(redisstreams.Config{Client: p.rdb, StreamPrefix: p.prefix, Partitions: 2})
		require.NoError(t, err)
		b = rb
	}
	db := &duplicatingBroker{Broker: b}
	db.left.Store(dupBatches)
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: db, PollInterval: 50 * time.Millisecond, BatchSize: 20, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)
}

func (p *pipeline) worker(t *testing.T, claimIdle time.Duration, extra ...handlers.Handler) *handlers.Worker {
	t.Helper()
	reg := events.NewRegistry()
	require.NoError(t, payment.Register(reg))
	w, err := handlers.NewWorker(handlers.WorkerConfig{
		Pool: p.schema.Pool, RedisURL: outflowtest.RedisURL(), Broker: p.backend, Registry: reg,
		StreamPartitions: 2, StreamPrefix: p.prefix, ClaimIdle: claimIdle, Logger: quiet,
	})
	require.NoError(t, err)
	require.NoError(t, w.Add(handlers.SyncAnalytics()))
	require.NoError(t, w.Add(handlers.NotifyMerchant(p.schema.Pool, handlers.NotifyConfig{})))
	for _, h := range extra {
		require.NoError(t, w.Add(h))
	}
	return w
}

// countingHandler is a consumer whose effect, in its transaction, is a row
// per message it applied; counted reads them back. (A handler may run more
// than once when its transaction rolls back, a shared batch's included:
// what must happen once is the committed effect.)
func countingHandler(t *testing.T, p *pipeline) (handlers.Handler, func() map[string]int) {
	t.Helper()
	_, err := p.schema.Pool.Exec(context.Background(), `CREATE TABLE counted (message_id text NOT NULL)`)
	require.NoError(t, err)
	h := handlers.Handler{Name: "counter", Topic: app.PaymentsTopic, Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO counted (message_id) VALUES ($1)`, ev.MessageID)
		return err
	}}
	return h, func() map[string]int {
		rows, err := p.schema.Pool.Query(context.Background(), `SELECT message_id, count(*) FROM counted GROUP BY message_id`)
		require.NoError(t, err)
		out := map[string]int{}
		for rows.Next() {
			var id string
			var n int
			require.NoError(t, rows.Scan(&id, &n))
			out[id] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
}

func run(t *testing.T, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// drive creates payments and moves them; it returns what the projection
// must show.
func (p *pipeline) drive(t *testing.T, merchantID string, n int) app.CurrencyStats {
	t.Helper()
	ctx := context.Background()
	want := app.CurrencyStats{Currency: "EUR"}
	for i := range n {
		pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: merchantID, Amount: int64(100 + i), Currency: "EUR"})
		require.NoError(t, err)
		if i%5 == 0 {
			continue // stays pending
		}
		_, err = p.svc.Pay(ctx, pay.ID)
		require.NoError(t, err)
		want.PaidCount++
		want.PaidAmount += pay.Amount
		if i%3 == 0 {
			half := pay.Amount / 2
			_, err = p.svc.Refund(ctx, pay.ID, &half)
			require.NoError(t, err)
			_, err = p.svc.Refund(ctx, pay.ID, nil)
			require.NoError(t, err)
			want.RefundedAmount += pay.Amount
		}
	}
	return want
}

func (p *pipeline) stats(t *testing.T, merchantID string) app.CurrencyStats {
	t.Helper()
	st, err := p.svc.GetMerchantStats(context.Background(), merchantID)
	require.NoError(t, err)
	if len(st.ByCurrency) == 0 {
		return app.CurrencyStats{Currency: "EUR"}
	}
	return st.ByCurrency[0]
}

// Outbox -> forwarder (publishing some batches twice) -> broker -> a
// worker stopped mid-run and another: every event delivered, each one's
// effect exactly once, on every backend.
func TestPipelineExactlyOnceDespiteDuplicates(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(string(b.kind), func(t *testing.T) {
			t.Parallel()
			p := newPipeline(t)
			p.backend = b.open(t)
			exactlyOnce(t, p)
		})
	}
}

func exactlyOnce(t *testing.T, p *pipeline) {
	m, err := p.svc.CreateMerchant(context.Background(), app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
	require.NoError(t, err)

	counter, counted := countingHandler(t, p)
	var events int
	countEvents := func() int {
		require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&events))
		return events
	}
	want := p.drive(t, m.ID, 60)
	p.runForwarder(t, 3)

	// The first worker stops once it has handled some of the events (a
	// graceful stop: what it held unacknowledged is redelivered to the next
	// after the claim time; kill -9 is tested on the real binary in
	// internal/cli); a second one, with another instance id, finishes.
	first := p.worker(t, time.Second, counter)
	ctx, stop := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(ctx) }()
	outflowtest.WaitFor(t, 30*time.Second, "the first worker to handle some events", func() bool {
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM processed_messages WHERE consumer = 'sync-analytics'`).Scan(&n))
		return n > 0
	})
	stop()
	require.NoError(t, <-firstDone)
	run(t, p.worker(t, time.Second, counter).Run)

	outflowtest.WaitFor(t, 30*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
	countEvents()
	outflowtest.WaitFor(t, 10*time.Second, "every event counted", func() bool { return len(counted()) == events })
	for id, n := range counted() {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
	// One webhook delivery per paid or refunded event, keyed by its message id.
	var paidOrRefunded int
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM outbox WHERE event_type IN ('payment.paid', 'payment.refunded')`).Scan(&paidOrRefunded))
	outflowtest.WaitFor(t, 10*time.Second, "a webhook delivery per paid or refunded event", func() bool {
		var deliveriesN, matching int
		require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `
			SELECT (SELECT count(*) FROM webhook_deliveries),
			       (SELECT count(*) FROM webhook_deliveries d JOIN outbox o ON o.message_id = d.message_id
			        WHERE o.event_type IN ('payment.paid', 'payment.refunded'))`).Scan(&deliveriesN, &matching))
		require.LessOrEqual(t, deliveriesN, paidOrRefunded, "never two deliveries for one event")
		return deliveriesN == paidOrRefunded && matching == paidOrRefunded
	})

	var dups int
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM (SELECT message_id FROM processed_messages GROUP BY message_id, consumer HAVING count(*) > 1) d`).Scan(&dups))
	require.Zero(t, dups)
}

// A consumer that died holding messages (delivered, never acknowledged) has
// them claimed by another after ClaimIdle.
func TestDeadConsumersMessagesAreClaimed(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	m, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
	require.NoError(t, err)
	want := p.drive(t, m.ID, 10)
	p.runForwarder(t, 0)
	streams := redisstreams.TopicStreams(p.prefix, app.PaymentsTopic, 2)
	var total int64
	outflowtest.WaitFor(t, 20*time.Second, "events on the streams", func() bool {
		total = 0
		for _, s := range streams {
			n, _ := p.rdb.XLen(ctx, s).Result()
			total += n
		}
		var events int64
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&events))
		return total == events
	})
	// The dead consumer: reads everything in the group, acknowledges nothing.
	for _, s := range streams {
		require.NoError(t, p.rdb.XGroupCreateMkStream(ctx, s, "sync-analytics", "0").Err())
		_, err := p.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "sync-analytics", Consumer: "dead", Streams: []string{s, ">"}, Count: 1000}).Result()
		require.NoError(t, err)
	}
	start := time.Now()
	run(t, p.worker(t, 500*time.Millisecond).Run)
	outflowtest.WaitFor(t, 30*time.Second, "the dead consumer's messages applied", func() bool { return p.stats(t, m.ID) == want })
	require.GreaterOrEqual(t, time.Since(start), 400*time.Millisecond, "claimed only after the idle time")
	t.Log(fmt.Sprintf("claimed and applied %d messages in %s", total, time.Since(start).Round(time.Millisecond)))
}
