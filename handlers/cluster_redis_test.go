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

// The demo pipeline (forwarder, workers, sender) on a three-primary Redis
// Cluster of the test's own, with the payments topic's six partitions on
// more than one primary; mid-run, the primary of one partition is killed
// (SIGKILL: what it had not replicated is gone) and its replica takes
// over; the killed node comes back as a replica. With WaitReplicas 1 the
// forwarder marked only what a replica had, so the run completes with the
// end-to-end checks: analytics exact, every event applied once by the
// counter, one webhook per paid or refunded event.
func TestPipelineOnRedisClusterWithAPrimaryKilled(t *testing.T) {
	t.Parallel()
	cluster := outflowtest.StartRedisCluster(t)
	p := newPipeline(t)
	p.backend = openBackend(t, brokers.Config{Kind: brokers.Redis, Partitions: 6,
		Redis: brokers.RedisConfig{URL: cluster.URL, WaitReplicas: 1, WaitTimeout: 200 * time.Millisecond}})
	streams := p.backend.Topics(app.PaymentsTopic)
	primaries := map[int]bool{}
	for _, s := range streams {
		primaries[cluster.PrimaryOf(s)] = true
	}
	require.Greater(t, len(primaries), 1, "the partitions spread over the primaries")

	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)
	want := p.drive(t, m.ID, 30)
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: p.backend.Broker(), PollInterval: 50 * time.Millisecond,
		BatchSize: 20, MaxAttempts: 2, OutageBackoffMax: 200 * time.Millisecond, Registerer: reg, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)
	run(t, p.worker(t, 2*time.Second, counter).Run)
	outflowtest.WaitFor(t, 30*time.Second, "the workers to apply some events", func() bool { return len(counted()) > 0 })

	killed := cluster.KillPrimaryOf(streams[0])
	t.Logf("killed %s, the primary of %s; its replica took over", cluster.Nodes[killed].Addr, streams[0])
	more := p.drive(t, m.ID, 30) // committed after the failover
	want.PaidCount += more.PaidCount
	want.PaidAmount = want.PaidAmount.Plus(more.PaidAmount)
	want.RefundedAmount = want.RefundedAmount.Plus(more.RefundedAmount)
	// The new primary has no replica: WAIT 1 holds its partitions' rows
	// until the killed node is back as its replica.
	cluster.Start(killed)

	outflowtest.WaitFor(t, 90*time.Second, "everything applied after the failover", func() bool {
		return p.stats(t, m.ID) == want && len(counted()) == p.events(t)
	})
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, want, p.stats(t, m.ID), "the projection still matches the payments")
	var touched int
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM outbox WHERE attempts > 0 OR parked_at IS NOT NULL`).Scan(&touched))
	require.Zero(t, touched, "a failover burns no attempt and parks nothing")
	t.Logf("broker unavailable during the failover: %v times", metricSum(t, reg, "outflow_forwarder_broker_unavailable_total"))
}
