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
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The end-to-end suite on a three-node JetStream cluster, the stream of
// three replicas, four partitions (the stream's subjects: each group's
// durable consumer per subject is an R3 consumer with a leader of its own,
// spread over the nodes). The stream's leader is killed mid-run, with the
// forwarder publishing and a worker consuming: nothing is lost, nothing
// applied twice, and the audit takes the election for no loss: it settles
// every receipt, and records no loss.
//
// Parallel: the test mostly waits (for failovers, elections and its
// servers: 41 CPU-seconds of its own, its servers' and the pipeline's, in
// 98 s for both cluster tests), and alone before the package's other
// tests it held the package for as long with the machine mostly idle.
func TestNATSClusterNodeKilledMidRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testservers.StartNATSCluster(t)
	p := newPipeline(t)
	cfg := brokers.Config{Kind: brokers.NATS, StreamPartitions: 4,
		NATS: brokers.NATSConfig{URL: c.URL, Replicas: 3, PublishTimeout: 2 * time.Second}}
	p.backend = openBackend(t, cfg)
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)

	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: openBackend(t, cfg).Broker(), PollInterval: 50 * time.Millisecond,
		BatchSize: 20, AuditInterval: 200 * time.Millisecond, OutageBackoffMax: 200 * time.Millisecond, Registerer: reg, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)
	w := p.worker(t, 2*time.Second, counter)
	run(t, w.Run)

	// settled reports whether the audit has judged every receipt: each
	// message found and acknowledged by every consumer, none left to check.
	settled := func() bool {
		var receipts int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_receipts`).Scan(&receipts))
		return receipts == 0
	}
	want := p.drive(t, m.ID, 20)
	// Subscribed to every topic too, replay topics included: a subscribe
	// the kill interrupts (its stream's creation waiting on an election)
	// fails the worker's start.
	outflowtest.WaitFor(t, 60*time.Second, "the first events applied by every consumer, settled by the audit, every topic subscribed", func() bool {
		return p.stats(t, m.ID) == want && len(counted()) == p.events(t) && settled() && w.Ready() == nil
	})

	conn, err := nats.Connect(c.URL)
	require.NoError(t, err)
	defer conn.Close()
	js, err := conn.JetStream()
	require.NoError(t, err)
	info, err := js.StreamInfo(app.PaymentsTopic)
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas)
	require.NotNil(t, info.Cluster)
	consumerLeaders := map[string]bool{}
	for ci := range js.ConsumersInfo(app.PaymentsTopic) {
		if ci.Cluster != nil {
			consumerLeaders[ci.Cluster.Leader] = true
		}
	}
	// One stream per topic, partitions are its subjects: the stream has one
	// leader, the groups' consumers (one per partition) many.
	require.GreaterOrEqual(t, len(consumerLeaders), 2, "the partitions' consumers lead on several nodes")
	leader := c.Node(info.Cluster.Leader)
	require.GreaterOrEqual(t, leader, 0, "the stream's leader %q is a node of the cluster", info.Cluster.Leader)

	// Events committed before, during and after the kill.
	more := p.drive(t, m.ID, 10)
	c.Kill(leader)
	more2 := p.drive(t, m.ID, 20)
	for _, s := range []app.CurrencyStats{more, more2} {
		want.PaidCount += s.PaidCount
		want.PaidAmount = want.PaidAmount.Plus(s.PaidAmount)
		want.RefundedAmount = want.RefundedAmount.Plus(s.RefundedAmount)
	}

	// Every receipt settled: the audit found each message the election
	// came through, and saw every consumer acknowledge it.
	outflowtest.WaitFor(t, 90*time.Second, "everything applied after the kill, and settled by the audit", func() bool {
		return p.stats(t, m.ID) == want && len(counted()) == p.events(t) && settled()
	})
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, want, p.stats(t, m.ID), "the projection still matches the payments")
	require.Zero(t, metricSum(t, reg, "outflow_forwarder_broker_losses_total"), "a leader election is no loss")
	var losses int
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_audit WHERE last_loss_at IS NOT NULL`).Scan(&losses))
	require.Zero(t, losses, "no loss recorded in outbox_audit")
}
