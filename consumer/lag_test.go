package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// gauge reads the series of name labelled consumer and topic; -1 when
// absent.
func gauge(t *testing.T, g prometheus.Gatherer, name, consumerName, topic string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if (l.GetName() == "consumer" && l.GetValue() != consumerName) || (l.GetName() == "topic" && l.GetValue() != topic) {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// While its consumer is stopped, the events published are its lag, with
// the age of the oldest; a worker running it drains them and its lag
// gauges go back to 0.
func TestLagWhileStoppedThenDrained(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: r.prefix}, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })
	lr, ok := backend.(brokers.LagReporter)
	require.True(t, ok, "the redis backend reports lag")

	runWorker := func(reg *prometheus.Registry) (stop func()) {
		cfg := r.config()
		cfg.Registerer, cfg.LagInterval = reg, 10*time.Millisecond
		w, err := consumer.NewWorker(cfg)
		require.NoError(t, err)
		require.NoError(t, w.Add(consumer.Handler{Name: "billing", Topic: ordersTopic, Func: record("billing")}))
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		return func() { cancel(); require.NoError(t, <-done) }
	}
	drained := func(reg *prometheus.Registry, handled float64) {
		t.Helper()
		require.Eventually(t, func() bool {
			return gauge(t, reg, idempotency.MetricHandled, "billing", ordersTopic) == handled &&
				gauge(t, reg, consumer.MetricLagEvents, "billing", ordersTopic) == 0 &&
				gauge(t, reg, consumer.MetricOldestUnhandledAge, "billing", ordersTopic) == 0
		}, 20*time.Second, 10*time.Millisecond, "handled %v and lag back to 0", handled)
		lag, err := lr.Lag(ctx, "billing", ordersTopic)
		require.NoError(t, err)
		require.Equal(t, brokers.Lag{}, lag)
	}
	requireLag := func(events int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			lag, err := lr.Lag(ctx, "billing", ordersTopic)
			require.NoError(t, err)
			require.Equal(t, events, lag.Events)
			return lag.OldestAge > 0
		}, 10*time.Second, time.Millisecond, "the oldest unhandled event has an age")
	}

	// Never started: its group does not exist yet and will read the
	// whole stream.
	r.publish(t, "o1", "o2", "o3")
	requireLag(3)
	reg := prometheus.NewRegistry()
	stop := runWorker(reg)
	drained(reg, 3)
	stop()

	// Stopped after it ran: what was published since is its lag.
	r.publish(t, "o4", "o5")
	requireLag(2)
	reg = prometheus.NewRegistry()
	stop = runWorker(reg)
	defer stop()
	drained(reg, 2)
}
