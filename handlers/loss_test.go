package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
// lose what it acknowledged. With reboot, the loss comes before any audit
// ran, with the forwarder down (a host reboot takes the broker and the
// service): the forwarder that published audits never, and a new one
// starts after the loss (issue 22, 1).
type brokerLoss struct {
	direct     brokers.Backend
	cut, uncut func()
	lose       func(t *testing.T)
	reboot     bool
}

// run drives payments, makes the broker lose them before the consumers
// read them (the consumers absent: their workers start after the loss; or
// present: running, cut off, back after the loss) and checks the end to
// end: with the audit on, the projection exact, each event's effect once,
// one webhook per paid or refunded event; with it off, the events lost.
// No audit needs to have run before the loss: the receipts the forwarder
// keeps in PostgreSQL are what the audit checks.
func (l brokerLoss) run(t *testing.T, p *pipeline, present, audit bool) {
	ctx := context.Background()
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)

	interval := 100 * time.Millisecond
	if !audit {
		interval = -1
	}
	reg := prometheus.NewRegistry()
	forward := func(interval time.Duration, reg prometheus.Registerer) func() {
		f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: l.direct.Broker(), PollInterval: 50 * time.Millisecond,
			BatchSize: 20, AuditInterval: interval, Registerer: reg, Logger: quiet})
		require.NoError(t, err)
		return runStoppable(t, f.Run)
	}
	var stopFirst func()
	if l.reboot && audit {
		stopFirst = forward(time.Hour, prometheus.NewRegistry()) // keeps receipts, never audits
	} else {
		stopFirst = forward(interval, reg)
	}

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
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&pending))
		return pending == 0
	})
	if l.reboot {
		stopFirst()
	}
	l.lose(t)
	if l.reboot {
		// The first audit of a stream knows none of its groups (no audit
		// ran before the loss): a group lost with the data and not back
		// yet cannot be awaited, and what the groups already back settle
		// may be trimmed under it (docs/broker-loss.md, "What it cannot
		// see"). The consumers come back within the first audit's
		// interval here, as a service's do within the default 20 s.
		forward(max(interval, 2*time.Second), reg)
	}
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

	t.Cleanup(func() { // what the audit did, when the test fails
		if !t.Failed() {
			return
		}
		logRows(t, p.schema.Pool, "outbox_audit", `SELECT broker_topic || ', last loss ' || coalesce(last_loss_reason, '') || ', '
			|| last_repaired || ' repaired, audited at ' || coalesce(audited_at::text, 'never') FROM outbox_audit`)
		logRows(t, p.schema.Pool, "state", `SELECT 'receipts unsettled ' || (SELECT coalesce(sum(cardinality(positions)), 0) FROM outbox_receipts)
			|| ', rows pending ' || (SELECT count(*) FROM outbox_state WHERE NOT published)`)
		t.Logf("events %d, counted %d, stats %+v, want %+v", p.events(t), len(counted()), p.stats(t, m.ID), want)
		logRows(t, p.schema.Pool, "dead_letters", `SELECT consumer || ' ' || status || ' ' || reason || ': ' || count(*) FROM dead_letters GROUP BY consumer, status, reason`)
		logRows(t, p.schema.Pool, "no webhook", `
			SELECT o.id || ' ' || o.aggregate_id || ' v' || o.aggregate_version || ' ' || o.event_type || ' created ' || o.created_at::time::text
			       || ' versions ' || coalesce((SELECT string_agg(consumer || '=' || version, ',') FROM consumer_aggregate_versions v
			                                  WHERE v.aggregate_id = o.aggregate_id), '')
			       || ' dead ' || coalesce((SELECT string_agg(consumer || ':' || status || ':' || reason || ':v' || aggregate_version, ',') FROM dead_letters d
			                                WHERE d.aggregate_id = o.aggregate_id), '')
			FROM outbox o WHERE o.event_type IN ('payment.paid', 'payment.refunded')
			  AND NOT EXISTS (SELECT 1 FROM webhook_endpoint_deliveries w WHERE w.message_id = o.message_id)`)
		logRows(t, p.schema.Pool, "webhook_endpoint_deliveries", `SELECT status || ': ' || count(*) FROM webhook_endpoint_deliveries GROUP BY status`)
	})
	outflowtest.WaitFor(t, 60*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, want, p.stats(t, m.ID), "the projection still matches the payments")
	require.GreaterOrEqual(t, metricSum(t, reg, "outflow_forwarder_broker_losses_total"), 1.0)
	require.GreaterOrEqual(t, metricSum(t, reg, "outflow_forwarder_repaired_total"), 20.0, "at least the events lost are published again")
}

// logRows logs each row of q, whose one column is the row as text, under
// label: what a failed test says of the state it left.
func logRows(t *testing.T, pool *pgxpool.Pool, label, q string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), q)
	if err != nil {
		t.Logf("%s: %v", label, err)
		return
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Logf("%s: %v", label, err)
	}
	for _, l := range lines {
		t.Logf("%s: %s", label, l)
	}
}
