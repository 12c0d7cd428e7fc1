package walrelay

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// walStatuses are the values of slot_wal_status's status label:
// pg_replication_slots.wal_status, and "missing" for a recorded slot that
// is gone.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost", "missing"}

type metrics struct {
	published, failedAttempts, parked *prometheus.CounterVec
	brokerLosses, repaired            *prometheus.CounterVec
	brokerUnavailable, heartbeats     prometheus.Counter
	historyRows, undecodable          prometheus.Counter
	batchSeconds                      prometheus.Histogram
	leader                            prometheus.Gauge
	// The slot, as pg_replication_slots shows it.
	slotLagBytes, slotRetainedBytes, slotSafeWALSize prometheus.Gauge
	slotWALStatus                                    *prometheus.GaugeVec
	parkedRows, heldRows                             prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "outflow", "walrelay"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	byTopic := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, []string{"topic"})
	}
	m := &metrics{
		published:         byTopic("published_total", "Events the broker acknowledged, by topic."),
		failedAttempts:    byTopic("failed_attempts_total", "Publish attempts the broker refused for the event's own reason, by topic."),
		parked:            byTopic("parked_total", "Events parked after MaxAttempts, by topic."),
		brokerLosses:      byTopic("broker_losses_total", "Audits that found the broker lost acknowledged events, by topic."),
		repaired:          byTopic("repaired_total", "Events put back from the history after the broker lost them, by topic."),
		brokerUnavailable: counter("broker_unavailable_total", "Batches that met an unavailable broker (no attempt counted)."),
		heartbeats:        counter("heartbeats_total", "Heartbeat messages an idle relay emitted to move its slot."),
		historyRows:       counter("history_rows_total", "Events written to outbox_wal_history."),
		undecodable:       counter("undecodable_total", "Messages with the writers' prefix that are no WALMessage (logged at Error)."),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "batch_seconds",
			Help: "Time from read to slot confirmation of one batch.", Buckets: prometheus.DefBuckets}),
		leader:            gauge("leader", "1 on the relay that holds the slot's reader lock, 0 on standbys."),
		slotLagBytes:      gauge("slot_lag_bytes", "WAL written since the slot's confirmed position: what the relay has not confirmed."),
		slotRetainedBytes: gauge("slot_retained_bytes", "WAL the slot keeps from removal (since its restart_lsn)."),
		slotSafeWALSize: gauge("slot_safe_wal_size_bytes",
			"WAL that can still be written before the slot is invalidated (pg_replication_slots.safe_wal_size); +Inf without max_slot_wal_keep_size."),
		slotWALStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "slot_wal_status",
			Help: "1 for the slot's wal_status (reserved, extended, unreserved, lost; missing: a slot the relay recorded is gone), 0 for the others."},
			[]string{"status"}),
		parkedRows: gauge("parked", "Events parked after MaxAttempts in outbox_wal_parked, waiting for an operator."),
		heldRows:   gauge("held", "Events in outbox_wal_parked: the parked, those waiting for a retry and those held behind them."),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.failedAttempts, m.parked, m.brokerLosses, m.repaired, m.brokerUnavailable, m.heartbeats,
		m.historyRows, m.undecodable, m.batchSeconds, m.leader, m.slotLagBytes, m.slotRetainedBytes, m.slotSafeWALSize,
		m.slotWALStatus, m.parkedRows, m.heldRows} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				// One relay per registry: a second is a configuration
				// error, not something to share counters with.
				return nil, fmt.Errorf("walrelay metrics: %w (one relay per Registerer)", err)
			}
			return nil, fmt.Errorf("walrelay metrics: %w", err)
		}
	}
	return m, nil
}

// setStatus makes status the one slot_wal_status at 1.
func (m *metrics) setStatus(status string) {
	for _, s := range walStatuses {
		v := 0.0
		if s == status {
			v = 1
		}
		m.slotWALStatus.WithLabelValues(s).Set(v)
	}
}
