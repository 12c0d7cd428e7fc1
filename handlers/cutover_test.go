package handlers_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// A running pipeline moves from Redis to NATS under load, as brokers.Tee
// documents: the forwarder publishes to both, workers start on NATS, the
// Redis workers stop once what only Redis had is handled, the forwarder
// drops Redis. Payments are made the whole time. Every event is applied
// once per consumer: the projection equals the payments, the counter
// committed one row per event, the merchant received one webhook per paid
// or refunded event.
func TestLiveCutoverRedisToNATS(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	redisB := backends[0].open(t)
	natsB := backends[1].open(t)
	require.Equal(t, brokers.Redis, redisB.Kind())
	require.Equal(t, brokers.NATS, natsB.Kind())
	ctx := context.Background()
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)

	// Load for the whole test.
	var (
		wantMu sync.Mutex
		want   = app.CurrencyStats{Currency: "EUR"}
	)
	lctx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for lctx.Err() == nil {
			s := p.drive(t, m.ID, 3)
			wantMu.Lock()
			want.PaidCount += s.PaidCount
			want.PaidAmount = want.PaidAmount.Plus(s.PaidAmount)
			want.RefundedAmount = want.RefundedAmount.Plus(s.RefundedAmount)
			wantMu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	events := func() (n int) {
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
		return n
	}
	start := func(fn func(context.Context) error) (stop func()) {
		c, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- fn(c) }()
		return func() { cancel(); require.NoError(t, <-done) }
	}
	newForwarder := func(b forwarder.Broker) func(context.Context) error {
		f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: b, PollInterval: 50 * time.Millisecond,
			BatchSize: 20, TakeoverAfter: time.Second, Logger: quiet})
		require.NoError(t, err)
		return f.Run
	}
	worker := func(b brokers.Backend) func(context.Context) error {
		p.backend = b
		return p.worker(t, time.Second, counter).Run
	}
	handledBy := func(maxID int64) bool {
		var left int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `
			SELECT count(*) FROM outbox o WHERE o.id <= $1 AND (
			    (SELECT count(*) FROM consumer_aggregate_versions v WHERE v.aggregate_type = o.aggregate_type
			        AND v.aggregate_id = o.aggregate_id AND v.version >= o.aggregate_version) < 3
			    OR EXISTS (SELECT 1 FROM dead_letters d WHERE d.message_id = o.message_id AND d.status IN ('retrying', 'dead', 'held')))`,
			maxID).Scan(&left))
		return left == 0
	}

	// Before: Redis only.
	stopFwd := start(newForwarder(redisB.Broker()))
	stopRedisWorker := start(worker(redisB))
	outflowtest.WaitFor(t, 20*time.Second, "events flowing on Redis", func() bool { return events() > 30 && handledBy(10) })

	// 1. The forwarder publishes to both; its Redis-only predecessor stops.
	stopTee := start(newForwarder(brokers.Tee(redisB.Broker(), natsB.Broker())))
	stopFwd()
	var lastRedisOnly int64
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox_state WHERE published`).Scan(&lastRedisOnly))
	// 2. Workers on NATS.
	stopNATSWorker := start(worker(natsB))
	// 3. Redis workers stop once everything only Redis had is handled
	// (rows published by the old forwarder; conservatively, all published
	// so far).
	outflowtest.WaitFor(t, 30*time.Second, "what only Redis had handled", func() bool { return handledBy(lastRedisOnly) })
	stopRedisWorker()
	// 4. NATS alone.
	stopNATSFwd := start(newForwarder(natsB.Broker()))
	stopTee()
	atSwitch := events()
	outflowtest.WaitFor(t, 20*time.Second, "more payments on NATS alone", func() bool { return events() >= atSwitch+15 })
	stopLoad()
	<-loadDone
	defer stopNATSWorker()
	defer stopNATSFwd()

	total := events()
	wantMu.Lock()
	final := want
	wantMu.Unlock()
	outflowtest.WaitFor(t, 30*time.Second, "every event handled", func() bool { return handledBy(1 << 62) })
	outflowtest.WaitFor(t, 10*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == final })
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, final, p.stats(t, m.ID), "the projection still matches the payments")
	t.Logf("%d events across the cutover; %d published while the forwarder wrote Redis only", total, lastRedisOnly)
}
