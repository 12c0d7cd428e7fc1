package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/idempotency"
)

// metricValue reads a counter's value, or a histogram's sample count, of
// the series of name labelled consumer and topic; 0 when absent.
func metricValue(t *testing.T, g prometheus.Gatherer, name, consumer, topic string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "consumer") != consumer || label(m, "topic") != topic {
				continue
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestMetricsCountDuplicatesAndHandled(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, h := setup(t, idempotency.Config{Metrics: reg, Topic: "accounts"})
	m := msgFor(t, "a", 1)
	for range 3 {
		_, err := h(m.Copy())
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricHandled, "balances", "accounts"))
	require.EqualValues(t, 2, metricValue(t, reg, idempotency.MetricDuplicates, "balances", "accounts"))
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricSeconds, "balances", "accounts"), "one duration observed")
	require.EqualValues(t, 0, metricValue(t, reg, idempotency.MetricHeld, "balances", "accounts"))
}

// Messages handled together share a transaction: each is counted once.
func TestMetricsCountBatchedMessages(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, h := setup(t, idempotency.Config{Metrics: reg, Topic: "accounts"})
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			_, err := h(msgFor(t, fmt.Sprintf("acc-%d", i), 1))
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.EqualValues(t, 30, metricValue(t, reg, idempotency.MetricHandled, "balances", "accounts"))
	require.EqualValues(t, 30, metricValue(t, reg, idempotency.MetricSeconds, "balances", "accounts"))
}

func TestMetricsCountHeldThenHandled(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b, h := setup(t, idempotency.Config{Metrics: reg, Topic: "accounts", MaxBatch: 1, RetryPollInterval: 10 * time.Millisecond})
	_, err := h(msgFor(t, "a", 2)) // ahead of version 1: held
	require.NoError(t, err)
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricHeld, "balances", "accounts"))
	require.EqualValues(t, 0, metricValue(t, reg, idempotency.MetricHandled, "balances", "accounts"))
	_, err = h(msgFor(t, "a", 1))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = b.consumer.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool {
		return metricValue(t, reg, idempotency.MetricHandled, "balances", "accounts") == 2
	}, 10*time.Second, 10*time.Millisecond, "version 2 applied by the retry loop and counted handled")
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricHeld, "balances", "accounts"), "held once")
	_, applied := b.balance("a")
	require.Equal(t, []int64{1, 2}, applied)
}

func TestMetricsCountRetriedThenDead(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b, h := setup(t, idempotency.Config{Metrics: reg, Topic: "accounts", MaxAttempts: 3,
		RetryBackoff: time.Millisecond, RetryBackoffMax: 2 * time.Millisecond, RetryPollInterval: 10 * time.Millisecond})
	b.fail = errors.New("merchant down")
	_, err := h(msgFor(t, "a", 1))
	require.NoError(t, err, "parked for a retry and acknowledged")
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricRetried, "balances", "accounts"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = b.consumer.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool {
		return metricValue(t, reg, idempotency.MetricDead, "balances", "accounts") == 1
	}, 10*time.Second, 10*time.Millisecond, "dead after 3 attempts")
	require.EqualValues(t, 2, metricValue(t, reg, idempotency.MetricRetried, "balances", "accounts"), "attempts 1 and 2 retried, 3 dead")
	require.EqualValues(t, 0, metricValue(t, reg, idempotency.MetricHandled, "balances", "accounts"))
}

func TestMetricsCountStale(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, h := setup(t, idempotency.Config{Metrics: reg, Topic: "accounts", Ordering: idempotency.LatestWins})
	for _, v := range []int64{2, 1} {
		_, err := h(msgFor(t, "a", v))
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricStale, "balances", "accounts"))
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricHandled, "balances", "accounts"))
}

// Two consumers of one process register into one registry: they share the
// collectors, each with its own labels.
func TestMetricsSharedRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, h1 := setup(t, idempotency.Config{Metrics: reg, Topic: "accounts", Consumer: "one"})
	_, h2 := setup(t, idempotency.Config{Metrics: reg, Topic: "accounts", Consumer: "two"})
	_, err := h1(msgFor(t, "a", 1))
	require.NoError(t, err)
	_, err = h2(msgFor(t, "a", 1))
	require.NoError(t, err)
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricHandled, "one", "accounts"))
	require.EqualValues(t, 1, metricValue(t, reg, idempotency.MetricHandled, "two", "accounts"))
}
