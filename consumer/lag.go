package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/poll"
)

// Lag metric names, labelled consumer and topic.
const (
	MetricLagEvents          = "outflow_consumer_lag_events"
	MetricOldestUnhandledAge = "outflow_consumer_oldest_unhandled_age_seconds"
)

type lagGauges struct {
	events, age *prometheus.GaugeVec
}

func newLagGauges(reg prometheus.Registerer) (lagGauges, error) {
	labels := []string{"consumer", "topic"}
	g := lagGauges{
		events: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricLagEvents,
			Help: "Events on the broker the consumer has not handled yet (undelivered and unacknowledged)."}, labels),
		age: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricOldestUnhandledAge,
			Help: "Age of the oldest event on the broker the consumer has not handled yet; 0 when none."}, labels),
	}
	var err error
	for _, v := range []**prometheus.GaugeVec{&g.events, &g.age} {
		if e := reg.Register(*v); e != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(e, &are) {
				err = errors.Join(err, e)
				continue
			}
			got, ok := are.ExistingCollector.(*prometheus.GaugeVec)
			if !ok {
				err = errors.Join(err, fmt.Errorf("%w: the registered collector is %T", e, are.ExistingCollector))
				continue
			}
			*v = got
		}
	}
	if err != nil {
		return g, fmt.Errorf("consumer lag metrics: %w", err)
	}
	return g, nil
}

// sampleLag sets the lag gauges of every handler every LagInterval until
// ctx is done. Lag describes the consumer group, not this process: every
// worker of the group reports the same value (use max(), not sum()).
func (w *Worker) sampleLag(ctx context.Context, lr brokers.LagReporter, g lagGauges) {
	poll.Every(ctx, w.cfg.LagInterval, func(ctx context.Context) error {
		var errs []error
		for _, h := range w.handlers {
			lag, err := lr.Lag(ctx, h.Name, h.Topic)
			if err != nil {
				errs = append(errs, fmt.Errorf("consumer %s, topic %s: %w", h.Name, h.Topic, err))
				continue
			}
			g.events.WithLabelValues(h.Name, h.Topic).Set(float64(lag.Events))
			g.age.WithLabelValues(h.Name, h.Topic).Set(lag.OldestAge.Seconds())
		}
		return errors.Join(errs...)
	}, poll.Warn(w.cfg.Logger, "read consumer lag"))
}
