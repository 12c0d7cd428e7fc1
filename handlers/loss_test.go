package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// brokerLoss is one broker-loss scenario of TestRedisLossRepaired and
// TestNATSLossRepaired: the pipeline's workers read through a proxy the
// test cuts (cut, uncut) so that they cannot read while the forwarder
// publishes; the forwarder writes through direct; lose makes the broker
// lose what it acknowledged.
type brokerLoss struct {
	direct     brokers.Backend
	cut, uncut func()
	lose       func(t *testing.T)
}

// run drives payments, makes the broker lose them before the consumers
// read them (the consumers absent: their workers start after the loss; or
// present: running, cut off, back after the loss) and checks the end to
// end: with the audit on, the projection exact, each event's effect once,
// one webhook per paid or refunded event; with it off, the events lost.
func (l brokerLoss) run(t *testing.T, p *pipeline, present, audit bool) {
	ctx := context.Background()
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)

	interval := 100 * time.Millisecond
	if !audit {
		interval = -1
	}
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: l.direct.Broker(), PollInterval: 50 * time.Millisecond,
		BatchSize: 20, AuditInterval: interval, Registerer: reg, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)

	want := app.CurrencyStats{Currency: "EUR"}
	add := func(s app.CurrencyStats) {
		want.PaidCount += s.PaidCount
		want.PaidAmount = want.PaidAmount.Plus(s.PaidAmount)
		want.RefundedAmount = want.RefundedAmount.Plus(s.RefundedAmount)
	}
	if present {
		// The consumers are subscribed, each group at its position, and
		// have applied the first events when the workers are cut off.
		w := p.worker(t, time.Second, counter)
		run(t, w.Run)
		add(p.drive(t, m.ID, 10))
		// Subscribed to every topic too (see brokerOutage): a subscribe
		// the cut interrupts fails the worker's start.
		outflowtest.WaitFor(t, 30*time.Second, "the first events applied by every consumer, every topic subscribed", func() bool {
			return p.stats(t, m.ID) == want && len(counted()) == p.events(t) && w.Ready() == nil
		})
		l.cut()
	}
	add(p.drive(t, m.ID, 20))
	outflowtest.WaitFor(t, 30*time.Second, "every event published", func() bool {
		var pending int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&pending))
		return pending == 0
	})
	// No audit needs to have run: the receipts of what was published are
	// committed with its marks, and the loss is found from them.
	l.lose(t)
	if present {
		l.uncut()
	} else {
		run(t, p.worker(t, time.Second, counter).Run)
	}

	if !audit {
		// Everything goes on, a new event included, and the lost events
		// stay lost.
		pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: 1, Currency: "EUR"})
		require.NoError(t, err)
		var sentinel string
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT message_id::text FROM outbox WHERE aggregate_id = $1`, pay.ID).Scan(&sentinel))
		outflowtest.WaitFor(t, 60*time.Second, "an event published after the loss applied", func() bool { return counted()[sentinel] > 0 })
		require.Less(t, len(counted()), p.events(t), "without the audit, events the broker lost never reach the consumers")
		require.NotEqual(t, want, p.stats(t, m.ID), "without the audit, the projection misses the lost events")
		return
	}

	outflowtest.WaitFor(t, 60*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, want, p.stats(t, m.ID), "the projection still matches the payments")
	require.GreaterOrEqual(t, metricSum(t, reg, "outflow_forwarder_broker_losses_total"), 1.0)
	require.GreaterOrEqual(t, metricSum(t, reg, "outflow_forwarder_repaired_total"), 20.0, "at least the events lost are published again")
}
