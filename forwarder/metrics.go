package forwarder

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/internal/poll"
)

type metrics struct {
	// forwarded, failedAttempts and parked carry the topic: which stream is
	// moving or failing is the first question when one stops. The topics are
	// the service's own (a handful), so the label stays small.
	forwarded, failedAttempts, parked *prometheus.CounterVec
	// brokerLosses and repaired count the audit's findings (audit_loop.go).
	brokerLosses, repaired       *prometheus.CounterVec
	brokerUnavailable, purged    prometheus.Counter
	publishSeconds, batchSeconds prometheus.Histogram
	partitionsOwned              prometheus.Gauge
	// partitionHeld is 1 for each partition an instance of this process
	// leases: summed by partition over all instances it must be 1, and a
	// 0 or a 2 is a partition nobody forwards or a lease bug.
	partitionHeld                         *prometheus.GaugeVec
	pending, parkedRows, oldestPendingAge prometheus.Gauge
	statsExporter                         prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns = "outflow"
	counter := func(sub, name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	gauge := func(sub, name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	byTopic := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "forwarder", Name: name, Help: help}, []string{"topic"})
	}
	m := &metrics{
		forwarded:         byTopic("forwarded_total", "Outbox rows the broker acknowledged, by topic."),
		failedAttempts:    byTopic("failed_attempts_total", "Publish attempts that failed for the row's own reason, by topic."),
		parked:            byTopic("parked_total", "Rows parked after MaxAttempts, by topic."),
		brokerLosses:      byTopic("broker_losses_total", "Losses of acknowledged entries the broker audit found, by topic."),
		repaired:          byTopic("repaired_total", "Rows published again after a broker loss, by topic."),
		brokerUnavailable: counter("forwarder", "broker_unavailable_total", "Batches that met an unavailable broker (no attempt counted)."),
		purged:            counter("forwarder", "purged_total", "Published rows deleted by retention."),
		publishSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "forwarder",
			Name: "publish_seconds", Help: "Time to publish one batch to the broker.", Buckets: buckets}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "forwarder",
			Name: "batch_seconds", Help: "Time from claim to commit of one batch.", Buckets: buckets}),
		partitionsOwned: gauge("forwarder", "partitions_owned", "Partitions leased by the forwarders of this process."),
		partitionHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: "forwarder", Name: "partition_held",
			Help: "1 for each partition a forwarder of this process leases: summed by partition over all instances, 1."}, []string{"partition"}),
		pending:          gauge("outbox", "pending", "Rows waiting to be forwarded (parked rows excluded)."),
		parkedRows:       gauge("outbox", "parked", "Rows parked after MaxAttempts, waiting for an operator."),
		oldestPendingAge: gauge("outbox", "oldest_pending_age_seconds", "Age of the oldest pending row: the one alert to set."),
		statsExporter: gauge("forwarder", "stats_exporter",
			"1 on the forwarder that exports the outbox gauges (the holder of partition 0), 0 on the others: their outbox gauges are 0."),
	}
	if reg == nil {
		return m, nil
	}
	// A second forwarder in the process (or anything else registering the
	// same names) shares the collectors already registered: counters and
	// histograms sum over the process, partitions_owned too (each instance
	// adds its change), and the outbox gauges describe the one table.
	var err error
	reuse := func(c prometheus.Collector) prometheus.Collector {
		if err != nil {
			return c
		}
		got, e := registerOrReuse(reg, c)
		if e != nil {
			err = e
			return c
		}
		return got
	}
	for _, c := range []**prometheus.CounterVec{&m.forwarded, &m.failedAttempts, &m.parked, &m.brokerLosses, &m.repaired} {
		*c = reuse(*c).(*prometheus.CounterVec)
	}
	m.partitionHeld = reuse(m.partitionHeld).(*prometheus.GaugeVec)
	for _, c := range []*prometheus.Counter{&m.brokerUnavailable, &m.purged} {
		*c = reuse(*c).(prometheus.Counter)
	}
	for _, h := range []*prometheus.Histogram{&m.publishSeconds, &m.batchSeconds} {
		*h = reuse(*h).(prometheus.Histogram)
	}
	for _, g := range []*prometheus.Gauge{&m.partitionsOwned, &m.pending, &m.parkedRows, &m.oldestPendingAge, &m.statsExporter} {
		*g = reuse(*g).(prometheus.Gauge)
	}
	if err != nil {
		return nil, fmt.Errorf("forwarder metrics: %w", err)
	}
	return m, nil
}

// registerOrReuse registers c, or returns the collector of the same
// description already registered, when it is of c's kind.
func registerOrReuse(reg prometheus.Registerer, c prometheus.Collector) (prometheus.Collector, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		return nil, err
	}
	switch c.(type) {
	case *prometheus.CounterVec:
		if v, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return v, nil
		}
	case *prometheus.GaugeVec:
		if v, ok := are.ExistingCollector.(*prometheus.GaugeVec); ok {
			return v, nil
		}
	case prometheus.Histogram:
		if h, ok := are.ExistingCollector.(prometheus.Histogram); ok {
			return h, nil
		}
	case prometheus.Gauge: // before Counter: a Gauge is a Counter too
		if g, ok := are.ExistingCollector.(prometheus.Gauge); ok {
			return g, nil
		}
	case prometheus.Counter:
		if x, ok := are.ExistingCollector.(prometheus.Counter); ok {
			return x, nil
		}
	}
	return nil, fmt.Errorf("%w: the registered collector is %T", err, are.ExistingCollector)
}

// statsLoop refreshes the outbox gauges, which describe the whole table
// rather than this instance: only one instance exports them (see
// exportsStats), so that a sum over instances is the table's.
func (f *Forwarder) statsLoop(ctx context.Context) {
	var st statsExport
	defer st.stop(f.metrics)
	poll.Every(ctx, statsInterval, func(ctx context.Context) error { return f.refreshStats(ctx, &st) },
		poll.Warn(f.cfg.Logger, "read outbox stats"))
}
