package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/sql"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
)

// The worker's lag gauges come from whatever LagReporter its backend has,
// not only Redis: on the sql backend, events a blocked handler holds are
// its lag, with an age, and go back to 0 once handled.
func TestLagGaugesOnTheSQLBackend(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.SQL, Logger: quiet,
		SQL: brokers.SQLConfig{DatabaseURL: r.schema.URL, PollInterval: 20 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })

	release := make(chan struct{})
	reg := prometheus.NewRegistry()
	cfg := r.config()
	cfg.Broker, cfg.Registerer, cfg.LagInterval = backend, reg, 10*time.Millisecond
	w, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	require.NoError(t, w.Add(consumer.Handler{Name: "billing", Topic: ordersTopic,
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			return record("billing")(ctx, tx, ev)
		}}))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	var out []forwarder.Outgoing
	for _, id := range []string{"o1", "o2", "o3"} {
		ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: id, Version: 1}, orderPlaced{OrderID: id, Amount: 10})
		require.NoError(t, err)
		msg, err := ev.Message(ctx)
		require.NoError(t, err)
		out = append(out, forwarder.Outgoing{Topic: ordersTopic, AggregateID: id, Message: msg})
	}
	for _, err := range backend.Broker().Publish(ctx, out) {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return gauge(t, reg, consumer.MetricLagEvents, "billing", ordersTopic) == 3 &&
			gauge(t, reg, consumer.MetricOldestUnhandledAge, "billing", ordersTopic) > 0
	}, 20*time.Second, 10*time.Millisecond, "lag 3, older than 0, while the handler is blocked")
	close(release)
	require.Eventually(t, func() bool {
		return gauge(t, reg, idempotency.MetricHandled, "billing", ordersTopic) == 3 &&
			gauge(t, reg, consumer.MetricLagEvents, "billing", ordersTopic) == 0 &&
			gauge(t, reg, consumer.MetricOldestUnhandledAge, "billing", ordersTopic) == 0
	}, 20*time.Second, 10*time.Millisecond, "handled 3 and lag back to 0")
}
