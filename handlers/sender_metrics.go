package handlers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/poll"
)

// Metric names of the webhook [Sender] (NotifyConfig.Registerer).
const (
	// MetricWebhookAttempts counts recorded attempts by outcome: delivered,
	// retry (failed, tried again later), dead (failed for good: a
	// permanent failure or MaxAttempts), lease_lost (recorded, but another
	// Sender had taken the delivery meanwhile).
	MetricWebhookAttempts = "outflow_webhook_attempts_total"
	// MetricWebhookAttemptSeconds is the duration of one POST, for the
	// attempts that made a request.
	MetricWebhookAttemptSeconds = "outflow_webhook_attempt_seconds"
	// MetricWebhookPending, MetricWebhookFailing and MetricWebhookDead are
	// [ReadWebhookStats] of the whole table, exported by one Sender at a
	// time (MetricWebhookStatsExporter); the others export 0.
	MetricWebhookPending       = "outflow_webhook_pending"
	MetricWebhookFailing       = "outflow_webhook_failing"
	MetricWebhookDead          = "outflow_webhook_dead"
	MetricWebhookStatsExporter = "outflow_webhook_stats_exporter"
)

// Outcomes of MetricWebhookAttempts: a fixed set, never a URL or a
// merchant.
const (
	outcomeDelivered = "delivered"
	outcomeRetry     = "retry"
	outcomeDead      = "dead"
	outcomeLeaseLost = "lease_lost"
)

type senderMetrics struct {
	attempts                         *prometheus.CounterVec
	seconds                          prometheus.Histogram
	pending, failing, dead, exporter prometheus.Gauge
}

// newSenderMetrics registers the Sender's collectors on reg, or reuses
// those another Sender of the process registered: the counters then sum
// over the process, and the table gauges are shared (only the exporter
// sets them). A nil reg gives nil: nothing is counted.
func newSenderMetrics(reg prometheus.Registerer) (*senderMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &senderMetrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricWebhookAttempts,
			Help: "Webhook delivery attempts recorded, by outcome (delivered, retry, dead, lease_lost)."}, []string{"outcome"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricWebhookAttemptSeconds,
			Help:    "Duration of one webhook POST, until the response's body was read or the request failed.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		pending: gauge(MetricWebhookPending, "Webhook deliveries waiting for their first or next attempt (one exporter: read with max())."),
		failing: gauge(MetricWebhookFailing, "Pending webhook deliveries with at least one failed attempt (one exporter: read with max())."),
		dead:    gauge(MetricWebhookDead, "Webhook deliveries that gave up, until retention deletes them (one exporter: read with max())."),
		exporter: gauge(MetricWebhookStatsExporter,
			"1 on the process whose Sender exports the webhook table gauges, 0 on the others: their table gauges are 0."),
	}
	var err error
	m.attempts = reuse(reg, m.attempts, &err)
	m.seconds = reuse(reg, m.seconds, &err)
	for _, g := range []*prometheus.Gauge{&m.pending, &m.failing, &m.dead, &m.exporter} {
		*g = reuse(reg, *g, &err)
	}
	if err != nil {
		return nil, fmt.Errorf("webhook sender metrics: %w", err)
	}
	// Every outcome's series exists from the start, so that a rate or a
	// ratio over them has data before the first failure.
	for _, o := range []string{outcomeDelivered, outcomeRetry, outcomeDead, outcomeLeaseLost} {
		m.attempts.WithLabelValues(o)
	}
	return m, nil
}

// reuse registers c on reg, or returns the collector of the same
// description already registered when it is of c's type; a failure is
// joined to *errp and c returned.
func reuse[T prometheus.Collector](reg prometheus.Registerer, c T, errp *error) T {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if x, ok := are.ExistingCollector.(T); ok {
			return x
		}
		err = fmt.Errorf("%w: the registered collector is %T", err, are.ExistingCollector)
	}
	*errp = errors.Join(*errp, err)
	return c
}

// observe records one attempt's request duration, when it made one.
func (m *senderMetrics) observe(a result) {
	if m == nil || !a.sent {
		return
	}
	m.seconds.Observe(a.latency.Seconds())
}

// count records a settled attempt's outcome.
func (m *senderMetrics) count(r settled, leaseLost bool) {
	if m == nil {
		return
	}
	o := outcomeRetry
	switch {
	case leaseLost:
		o = outcomeLeaseLost
	case r.status == "delivered":
		o = outcomeDelivered
	case r.status == "dead":
		o = outcomeDead
	}
	m.attempts.WithLabelValues(o).Inc()
}

// statsExporter exports the webhook table gauges from one Sender at a time.
//
// The gauges describe the one table, so every Sender exporting them would
// make sum() across instances count it once per instance. The exporter is
// the Sender holding a session advisory lock, on a connection of its own
// kept for as long as it exports: Senders have no partitions to elect one
// by (as the forwarders elect the holder of partition 0), and the lock
// frees itself when the exporter's process or connection dies, so another
// Sender takes over within one StatsInterval, without a table of leases.
// That connection is opened outside the pool, so exporting takes none of
// the pool's slots; the others only probe the lock through the pool (a
// transaction-scoped try, released at once) and open a connection only
// when it is free. Only the exporter reads the table, on its locked
// connection: one stats query per interval for the whole fleet, and a
// broken connection (lock lost) is an error that ends the export. The
// others keep the gauges at 0 (not absent: a series that comes and goes
// breaks rate windows and alerts with a for: clause). Behind PgBouncer in
// transaction pooling mode a session lock is not held by the client, and
// two Senders may both export: dashboards and alerts read the gauges with
// max(), which is right either way.
type statsExporter struct {
	pool *pgxpool.Pool
	m    *senderMetrics
	conn *pgx.Conn // holds the lock; nil: not exporting
}

const tryStatsLockSQL = `SELECT pg_try_advisory_lock($1, hashtext(current_schema()))`

func (s *Sender) statsLoop(ctx context.Context) {
	e := &statsExporter{pool: s.pool, m: s.metrics}
	defer e.stop()
	poll.Every(ctx, s.cfg.StatsInterval, e.refresh, poll.Warn(s.cfg.Logger, "export webhook stats"))
}

// refresh takes the lock if it is free, and sets the gauges while it holds
// it.
func (e *statsExporter) refresh(ctx context.Context) error {
	if e.conn == nil {
		var free bool
		if err := e.pool.QueryRow(ctx, advisory.TrySQL, advisory.WebhookStats).Scan(&free); err != nil {
			return fmt.Errorf("probe the webhook stats lock: %w", err)
		}
		if !free {
			return nil
		}
		conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
		if err != nil {
			return fmt.Errorf("connect for the webhook stats lock: %w", err)
		}
		var got bool
		if err := conn.QueryRow(ctx, tryStatsLockSQL, advisory.WebhookStats).Scan(&got); err != nil || !got {
			closeConn(conn)
			if err != nil {
				return fmt.Errorf("take the webhook stats lock: %w", err)
			}
			return nil // another Sender took it since the probe
		}
		e.conn = conn
		e.m.exporter.Add(1) // Add: the gauge is shared by the Senders of a process
	}
	st, err := readWebhookStats(ctx, e.conn)
	if err != nil {
		e.stop() // the connection, and perhaps the lock, may be gone
		return err
	}
	e.m.pending.Set(float64(st.Pending))
	e.m.failing.Set(float64(st.Failing))
	e.m.dead.Set(float64(st.Dead))
	return nil
}

// stop hands the export over: closing the connection releases the lock,
// and the gauges drop to 0 so that the next exporter's values are not
// added to stale ones.
func (e *statsExporter) stop() {
	if e.conn == nil {
		return
	}
	closeConn(e.conn)
	e.conn = nil
	e.m.exporter.Add(-1)
	e.m.pending.Set(0)
	e.m.failing.Set(0)
	e.m.dead.Set(0)
}

// closeConn closes conn, bounded: it may be called once ctx ended.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
