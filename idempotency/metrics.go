package idempotency

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, labelled consumer and topic (Config.Consumer and
// Config.Topic).
const (
	MetricHandled    = "outflow_consumer_handled_total"
	MetricDuplicates = "outflow_consumer_duplicates_total"
	MetricStale      = "outflow_consumer_stale_total"
	MetricHeld       = "outflow_consumer_held_total"
	MetricRetried    = "outflow_consumer_retried_total"
	MetricDead       = "outflow_consumer_dead_total"
	MetricSeconds    = "outflow_consumer_handling_seconds"
)

// metrics are one consumer's counters, curried with its labels. A nil
// *metrics counts nothing: a consumer without Config.Metrics pays one nil
// check per outcome.
type metrics struct {
	handled, duplicates, stale, held, retried, dead prometheus.Counter
	seconds                                         prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, consumer, topic string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := []string{"consumer", "topic"}
	var err error
	counter := func(name, help string) prometheus.Counter {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		got, e := registerOrReuse(reg, v)
		if e != nil {
			err = errors.Join(err, e)
			return v.WithLabelValues(consumer, topic)
		}
		return got.WithLabelValues(consumer, topic)
	}
	m := &metrics{
		handled:    counter(MetricHandled, "Messages whose handler ran and committed."),
		duplicates: counter(MetricDuplicates, "Deliveries skipped: the message was handled already."),
		stale:      counter(MetricStale, "Messages skipped: a later version of the aggregate was applied (LatestWins, or before a baseline)."),
		held:       counter(MetricHeld, "Messages held behind an earlier version of their aggregate (a gap, or an open dead letter)."),
		retried:    counter(MetricRetried, "Handler failures scheduled for a retry."),
		dead:       counter(MetricDead, "Messages dead-lettered: MaxAttempts failures, or a gap that timed out."),
	}
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricSeconds,
		Help:    "Time to handle and commit a message (a shared transaction's time for each of its messages).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, labels)
	got, e := registerOrReuse(reg, h)
	if e != nil {
		err = errors.Join(err, e)
		got = h
	}
	m.seconds = got.WithLabelValues(consumer, topic)
	if err != nil {
		return nil, fmt.Errorf("idempotency metrics: %w", err)
	}
	return m, nil
}

// registerOrReuse registers c, or returns the collector of the same
// description already registered (by another consumer of the process), so
// that every consumer shares one vector and adds its own labels.
func registerOrReuse[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if x, ok := are.ExistingCollector.(T); ok {
			return x, nil
		}
		return c, fmt.Errorf("%w: the registered collector is %T", err, are.ExistingCollector)
	}
	return c, err
}

// count records the outcome o of one message handled in d.
func (m *metrics) count(o outcome, d time.Duration) {
	if m == nil {
		return
	}
	switch o {
	case applied:
		m.handled.Inc()
		m.seconds.Observe(d.Seconds())
	case duplicate:
		m.duplicates.Inc()
	case stale:
		m.stale.Inc()
	case gap, held:
		m.held.Inc()
	}
}

// failed records a handler failure that left the message status.
func (m *metrics) failed(status string) {
	if m == nil {
		return
	}
	if status == "dead" {
		m.dead.Inc()
	} else {
		m.retried.Inc()
	}
}
