package forwarder

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	forwarded, failedAttempts, parked, brokerUnavailable, notifications, purged prometheus.Counter
	publishSeconds, batchSeconds                                                prometheus.Histogram
	partitionsOwned                                                             prometheus.Gauge
	pending, parkedRows, oldestPendingAge                                       prometheus.Gauge
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
	m := &metrics{
		forwarded:         counter("forwarder", "forwarded_total", "Outbox rows the broker acknowledged."),
		failedAttempts:    counter("forwarder", "failed_attempts_total", "Publish attempts that failed for the row's own reason."),
		parked:            counter("forwarder", "parked_total", "Rows parked after MaxAttempts."),
		brokerUnavailable: counter("forwarder", "broker_unavailable_total", "Batches that met an unavailable broker (no attempt counted)."),
		notifications:     counter("forwarder", "notifications_total", "LISTEN/NOTIFY wake-ups."),
		purged:            counter("forwarder", "purged_total", "Published rows deleted by retention."),
		publishSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "forwarder",
			Name: "publish_seconds", Help: "Time to publish one batch to the broker.", Buckets: buckets}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "forwarder",
			Name: "batch_seconds", Help: "Time from claim to commit of one batch.", Buckets: buckets}),
		partitionsOwned:  gauge("forwarder", "partitions_owned", "Partitions leased by this instance."),
		pending:          gauge("outbox", "pending", "Rows waiting to be forwarded (parked rows excluded)."),
		parkedRows:       gauge("outbox", "parked", "Rows parked after MaxAttempts, waiting for an operator."),
		oldestPendingAge: gauge("outbox", "oldest_pending_age_seconds", "Age of the oldest pending row: the one alert to set."),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.forwarded, m.failedAttempts, m.parked, m.brokerUnavailable, m.notifications,
		m.purged, m.publishSeconds, m.batchSeconds, m.partitionsOwned, m.pending, m.parkedRows, m.oldestPendingAge} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return nil, err
		}
	}
	return m, nil
}

// statsLoop refreshes the outbox gauges, which describe the whole table
// rather than this instance.
func (f *Forwarder) statsLoop(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		if s, err := ReadStats(ctx, f.cfg.Pool); err == nil {
			f.metrics.pending.Set(float64(s.Pending))
			f.metrics.parkedRows.Set(float64(s.Parked))
			f.metrics.oldestPendingAge.Set(s.OldestPendingAgeSeconds)
		} else if ctx.Err() == nil {
			f.cfg.Logger.Warn("read outbox stats", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
