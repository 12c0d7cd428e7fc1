package forwarder_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Two forwarders of one outbox, each with its registry as in two processes:
// one exports the outbox gauges, so their sum over both is the table's.
func TestOutboxGaugesSumOverInstances(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The broker is down: every row stays pending, and the count is known.
	srv := testservers.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	opts.MaxRetries = -1
	opts.DialTimeout = 200 * time.Millisecond
	own := redis.NewClient(opts)
	t.Cleanup(func() { own.Close() })
	e.useRedis(own)
	srv.Stop()
	e.writeMany(aggregates(5), 1, 5)
	pending := e.count("published_at IS NULL AND parked_at IS NULL")
	require.Equal(t, 25, pending)

	regs := make([]*prometheus.Registry, 2)
	for i := range regs {
		regs[i] = prometheus.NewRegistry()
		e.run(e.config(func(c *forwarder.Config) {
			c.InstanceID = "g-" + strconv.Itoa(i)
			c.Registerer = regs[i]
			c.LeaseRenewInterval = 100 * time.Millisecond
		}))
	}
	sum := func(name string) float64 {
		return gauge(t, regs[0], name) + gauge(t, regs[1], name)
	}
	outflowtest.WaitFor(t, 20*time.Second, "both instances lease partitions and one exports", func() bool {
		return gauge(t, regs[0], "outflow_forwarder_partitions_owned") > 0 &&
			gauge(t, regs[1], "outflow_forwarder_partitions_owned") > 0 &&
			sum("outflow_forwarder_stats_exporter") == 1 && sum("outflow_outbox_pending") > 0
	})
	require.Equal(t, float64(pending), sum("outflow_outbox_pending"), "the sum over instances is the table's pending count")
	require.Positive(t, sum("outflow_outbox_oldest_pending_age_seconds"))
	for _, reg := range regs {
		if gauge(t, reg, "outflow_forwarder_stats_exporter") == 0 {
			require.Zero(t, gauge(t, reg, "outflow_outbox_pending"), "a non-exporter's gauges are 0")
		}
	}
}
