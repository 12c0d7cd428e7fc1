package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// gather reads the registry's value of each metric name with the given
// labels (outcome only, here), and the histogram's sample count under
// name + "_count".
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.Counter != nil:
				out[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[name] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[name+"_count"] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

// Attempts are counted by outcome as they are recorded, and every POST's
// duration is observed, by two Senders on one registry: a 200 is delivered, a 500 a retry until
// MaxAttempts makes it dead, a 410 dead at once.
func TestSenderCountsAttemptsByOutcome(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/ok"):
			w.WriteHeader(http.StatusOK)
		case strings.HasSuffix(r.URL.Path, "/gone"):
			w.WriteHeader(http.StatusGone)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	record(t, p, merchant(t, p, "OK", srv.URL+"/ok"), 2)
	record(t, p, merchant(t, p, "Failing", srv.URL+"/fail"), 1)
	record(t, p, merchant(t, p, "Gone", srv.URL+"/gone"), 1)

	// Two Senders of one process share the registry's collectors: the
	// counts are the process's.
	reg := prometheus.NewRegistry()
	cfg := handlers.NotifyConfig{Registerer: reg, MaxAttempts: 3, Backoff: 10 * time.Millisecond,
		BackoffMax: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond}
	run(t, newSender(t, p, cfg).Run)
	run(t, newSender(t, p, cfg).Run)

	attempts := handlers.MetricWebhookAttempts + "{outcome="
	outflowtest.WaitFor(t, 15*time.Second, "every delivery settled and counted", func() bool {
		g := gather(t, reg)
		return g[attempts+"delivered}"] == 2 && g[attempts+"dead}"] == 2
	})
	g := gather(t, reg)
	require.Equal(t, 2.0, g[attempts+"retry}"], "the 500's first two attempts")
	require.Zero(t, g[attempts+"lease_lost}"])
	require.Equal(t, 6.0, g[handlers.MetricWebhookAttemptSeconds+"_count"], "one observation per POST")
	require.Equal(t, 6, count(t, p, `SELECT count(*) FROM webhook_attempts`), "the counters match the attempts on record")
}

// The table gauges match ReadWebhookStats, and of two Senders on one
// database exactly one exports them; when it stops, the other takes over.
func TestOneSenderExportsTheWebhookGauges(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	m := merchant(t, p, "Later", "http://127.0.0.1:1/never")
	ids := record(t, p, m, 6)
	// Nothing due: the table stays as set while the Senders run.
	_, err := p.schema.Pool.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour'`)
	require.NoError(t, err)
	_, err = p.schema.Pool.Exec(ctx, `UPDATE webhook_deliveries SET attempts = 2 WHERE id = ANY($1)`, ids[:1])
	require.NoError(t, err)
	_, err = p.schema.Pool.Exec(ctx, `UPDATE webhook_deliveries SET status = 'dead', attempts = 10 WHERE id = ANY($1)`, ids[4:])
	require.NoError(t, err)
	want, err := handlers.ReadWebhookStats(ctx, p.schema.Pool)
	require.NoError(t, err)
	require.Equal(t, handlers.WebhookStats{Pending: 4, Failing: 1, Dead: 2}, want)

	type instance struct {
		reg  *prometheus.Registry
		stop func()
		done chan error
	}
	// Each Sender has a pool of its own, as in two processes: a lock
	// left on a pooled connection would stay held after its Sender stopped.
	start := func() *instance {
		in := &instance{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
		pool, err := pgxpool.New(ctx, p.schema.URL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s := handlers.NewSender(pool, handlers.NotifyConfig{Registerer: in.reg, StatsInterval: 20 * time.Millisecond,
			PollInterval: 20 * time.Millisecond, Logger: quiet, AllowPrivate: true})
		rctx, cancel := context.WithCancel(ctx)
		go func() { in.done <- s.Run(rctx) }()
		in.stop = func() {
			if cancel != nil {
				cancel()
				require.NoError(t, <-in.done)
				cancel = nil
			}
		}
		t.Cleanup(in.stop)
		return in
	}
	gauges := func(in *instance) [4]float64 {
		g := gather(t, in.reg)
		return [4]float64{g[handlers.MetricWebhookStatsExporter], g[handlers.MetricWebhookPending],
			g[handlers.MetricWebhookFailing], g[handlers.MetricWebhookDead]}
	}
	exporting := [4]float64{1, float64(want.Pending), float64(want.Failing), float64(want.Dead)}
	a, b := start(), start()
	var exporter, other *instance
	outflowtest.WaitFor(t, 10*time.Second, "one Sender exports the table's values", func() bool {
		switch ga, gb := gauges(a), gauges(b); {
		case ga == exporting && gb == [4]float64{}:
			exporter, other = a, b
		case gb == exporting && ga == [4]float64{}:
			exporter, other = b, a
		}
		return exporter != nil
	})
	// Several refreshes later, still one exporter: the other tried the lock
	// and stayed at 0.
	tries := 0
	outflowtest.WaitFor(t, 10*time.Second, "ten more looks at both", func() bool {
		require.Equal(t, exporting, gauges(exporter))
		require.Equal(t, [4]float64{}, gauges(other), "the other Sender exports 0")
		tries++
		return tries == 10
	})

	exporter.stop()
	outflowtest.WaitFor(t, 10*time.Second, "the other Sender took the export over", func() bool {
		return gauges(other) == exporting
	})
	require.Equal(t, [4]float64{}, gauges(exporter), "a stopped exporter drops its gauges to 0")
}
