package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// NATS loses what it acknowledged between the forwarder's publish and the
// consumers' reads: the stream is deleted and created again (as an
// operator would, with the same settings), the consumers absent (their
// workers start after the loss) or present (running, cut off from NATS
// while the forwarder publishes, back after the loss). With the audit on,
// every check of the end-to-end suite holds; with it off, the same failure
// loses events for good: the test proves something.
func TestNATSLossRepaired(t *testing.T) {
	t.Parallel()
	for _, present := range []bool{false, true} {
		for _, audit := range []bool{true, false} {
			name := "consumers absent"
			if present {
				name = "consumers present"
			}
			if audit {
				name += ", audit on"
			} else {
				name += ", audit off"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				natsLoss(t, present, audit)
			})
		}
	}
}

func natsLoss(t *testing.T, present, audit bool) {
	ctx := context.Background()
	srv := outflowtest.StartNATS(t)
	proxy := outflowtest.StartProxy(t, srv.URL[len("nats://"):])
	p := newPipeline(t)
	// The workers connect through the proxy; the forwarder directly.
	p.backend = openBackend(t, brokers.Config{Kind: brokers.NATS, Partitions: 2, NATS: brokers.NATSConfig{URL: "nats://" + proxy.Addr}})
	direct := openBackend(t, brokers.Config{Kind: brokers.NATS, Partitions: 2, NATS: brokers.NATSConfig{URL: srv.URL}})
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)

	interval := 100 * time.Millisecond
	if !audit {
		interval = -1
	}
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: direct.Broker(), PollInterval: 50 * time.Millisecond,
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
		run(t, p.worker(t, time.Second, counter).Run)
		add(p.drive(t, m.ID, 10))
		outflowtest.WaitFor(t, 30*time.Second, "the first events applied by every consumer", func() bool {
			return p.stats(t, m.ID) == want && len(counted()) == p.events(t)
		})
		proxy.Stop()
	}
	add(p.drive(t, m.ID, 20))
	outflowtest.WaitFor(t, 30*time.Second, "every event published", func() bool {
		var pending int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&pending))
		return pending == 0
	})
	if audit {
		outflowtest.WaitFor(t, 10*time.Second, "the audit's baseline of both subjects", func() bool {
			var n int
			require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_audit WHERE state IS NOT NULL`).Scan(&n))
			return n == 2
		})
	}

	// The loss: the stream deleted, and created again as it was.
	conn, err := nats.Connect(srv.URL)
	require.NoError(t, err)
	defer conn.Close()
	js, err := conn.JetStream()
	require.NoError(t, err)
	info, err := js.StreamInfo(app.PaymentsTopic)
	require.NoError(t, err)
	require.NoError(t, js.DeleteStream(app.PaymentsTopic))
	outflowtest.WaitFor(t, 10*time.Second, "the deleted stream's files removed", func() bool { return !srv.StreamStored(app.PaymentsTopic) })
	_, err = js.AddStream(&info.Config)
	require.NoError(t, err)

	if present {
		proxy.Start()
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
		require.Less(t, len(counted()), p.events(t), "without the audit, events lost with the stream never reach the consumers")
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
