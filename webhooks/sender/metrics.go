package sender

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names of a [Sender] (Config.Registerer). They differ from the
// app's older outflow_webhook_* names, so that both can run in one process.
const (
	// MetricAttempts counts recorded attempts by outcome: delivered,
	// retry, failed (for good), lease_lost (recorded, decided nothing).
	MetricAttempts = "outflow_webhook_endpoint_attempts_total"
	// MetricAttemptSeconds is the duration of one POST, for the attempts
	// that made a request.
	MetricAttemptSeconds = "outflow_webhook_endpoint_attempt_seconds"
	// MetricCircuitsOpened counts circuits opened (or reopened after a
	// failed probe).
	MetricCircuitsOpened = "outflow_webhook_endpoint_circuits_opened_total"
	// MetricDisabled counts endpoints disabled for failing too long.
	MetricDisabled = "outflow_webhook_endpoint_disabled_total"
)

// Outcomes of MetricAttempts: a fixed set, never a URL or an account.
const (
	outcomeDelivered = "delivered"
	outcomeRetry     = "retry"
	outcomeFailed    = "failed"
	outcomeLeaseLost = "lease_lost"
)

type metrics struct {
	attempts         *prometheus.CounterVec
	seconds          prometheus.Histogram
	opened, disabled prometheus.Counter
}

// newMetrics registers the Sender's collectors on reg, or reuses those
// another Sender of the process registered (the counts then sum over the
// process). A nil reg gives nil: nothing is counted.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricAttempts,
			Help: "Webhook endpoint delivery attempts recorded, by outcome (delivered, retry, failed, lease_lost)."},
			[]string{"outcome"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricAttemptSeconds,
			Help:    "Duration of one webhook POST, until the response's body was read or the request failed.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		opened: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricCircuitsOpened,
			Help: "Webhook endpoint circuits opened after a run of failures, a failed probe or a Retry-After."}),
		disabled: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricDisabled,
			Help: "Webhook endpoints disabled for failing longer than DisableAfter."}),
	}
	var err error
	m.attempts = reuse(reg, m.attempts, &err)
	m.seconds = reuse(reg, m.seconds, &err)
	m.opened = reuse(reg, m.opened, &err)
	m.disabled = reuse(reg, m.disabled, &err)
	if err != nil {
		return nil, fmt.Errorf("webhook sender metrics: %w", err)
	}
	// Every outcome's series exists from the start, so that a rate or a
	// ratio over them has data before the first failure.
	for _, o := range []string{outcomeDelivered, outcomeRetry, outcomeFailed, outcomeLeaseLost} {
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
func (m *metrics) observe(a result) {
	if m == nil || !a.sent {
		return
	}
	m.seconds.Observe(a.latency.Seconds())
}

// count records a settled attempt's outcome.
func (m *metrics) count(r settled, leaseLost bool) {
	if m == nil {
		return
	}
	o := outcomeRetry
	switch {
	case leaseLost:
		o = outcomeLeaseLost
	case r.status == "delivered":
		o = outcomeDelivered
	case r.status == "failed":
		o = outcomeFailed
	}
	m.attempts.WithLabelValues(o).Inc()
}

// endpoints counts the circuits a settle opened and the endpoints it
// disabled.
func (m *metrics) endpoints(opened, disabled int) {
	if m == nil {
		return
	}
	m.opened.Add(float64(opened))
	m.disabled.Add(float64(disabled))
}
