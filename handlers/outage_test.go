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

// NATS goes down mid-run and comes back: the forwarder burns no attempt
// (MaxAttempts 2 would park every row otherwise) and drains the backlog,
// the worker resumes, every effect is there once.
func TestNATSOutageMidRun(t *testing.T) {
	t.Parallel()
	srv := outflowtest.StartNATS(t)
	p := newPipeline(t)
	p.backend = openBackend(t, brokers.Config{Kind: brokers.NATS, Partitions: 2, NATS: brokers.NATSConfig{URL: srv.URL, PublishTimeout: 500 * time.Millisecond}})
	ctx := context.Background()
	m, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
	require.NoError(t, err)

	want := p.drive(t, m.ID, 10)
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: p.backend.Broker(), PollInterval: 50 * time.Millisecond,
		BatchSize: 20, MaxAttempts: 2, OutageBackoffMax: 200 * time.Millisecond, Registerer: reg, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)
	run(t, p.worker(t, 2*time.Second).Run)
	outflowtest.WaitFor(t, 20*time.Second, "the first payments applied", func() bool { return p.stats(t, m.ID) == want })
	outflowtest.WaitFor(t, 20*time.Second, "every consumer group bound", func() bool { return natsConsumersBound(t, srv.URL) == 2*2 })

	srv.Stop()
	more := p.drive(t, m.ID, 10) // committed while NATS is down
	want.PaidCount += more.PaidCount
	want.PaidAmount += more.PaidAmount
	want.RefundedAmount += more.RefundedAmount
	outflowtest.WaitFor(t, 20*time.Second, "the forwarder to meet the outage", func() bool {
		return metricSum(t, reg, "outflow_forwarder_broker_unavailable_total") >= 3
	})
	srv.Start()

	outflowtest.WaitFor(t, 60*time.Second, "everything applied after the outage", func() bool { return p.stats(t, m.ID) == want })
	var touched int
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE attempts > 0 OR parked_at IS NOT NULL`).Scan(&touched))
	require.Zero(t, touched, "an outage burns no attempt and parks nothing")
}

// natsConsumersBound counts the durable consumers the worker created (one
// per group and subject, at Subscribe).
func natsConsumersBound(t *testing.T, url string) int {
	conn, err := nats.Connect(url)
	require.NoError(t, err)
	defer conn.Close()
	js, err := conn.JetStream()
	require.NoError(t, err)
	n := 0
	for stream := range js.StreamNames() {
		for range js.ConsumersInfo(stream) {
			n++
		}
	}
	return n
}

func metricSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
