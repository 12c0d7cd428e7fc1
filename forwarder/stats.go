package forwarder

import (
	"context"
	"slices"
	"time"
)

// statsInterval is how often the outbox gauges are refreshed.
const statsInterval = 5 * time.Second

// statsExport is whether this instance exports the outbox gauges.
//
// The gauges describe the one table, so every instance exporting them
// would make sum() across instances count it once per instance. One does:
// the holder of partition 0, which exists whatever the partition count and
// has exactly one holder while leases are healthy. The others keep the
// gauges at 0 (not absent: a series that appears and vanishes with each
// lease move breaks rate windows and alerts with a for: clause), and
// outflow_forwarder_stats_exporter says which instance exports; sum() and
// max() over instances both give the table's value. While partition 0 moves
// the two instances may, for up to one statsInterval, both export or
// neither. Only the exporter reads the table: one stats query per tick for
// the whole fleet.
type statsExport struct {
	exporting bool
}

// exportsStats reports whether this instance holds partition 0.
func (f *Forwarder) exportsStats() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.owned, 0)
}

func (f *Forwarder) refreshStats(ctx context.Context, st *statsExport) error {
	if !f.exportsStats() {
		st.stop(f.metrics)
		return nil
	}
	s, err := ReadStats(ctx, f.cfg.Pool)
	if err != nil {
		return err
	}
	if !st.exporting {
		st.exporting = true
		// Add, not Set: the gauge is shared by the forwarders of a process.
		f.metrics.statsExporter.Add(1)
	}
	f.metrics.pending.Set(float64(s.Pending))
	f.metrics.parkedRows.Set(float64(s.Parked))
	f.metrics.oldestPendingAge.Set(s.OldestPendingAgeSeconds)
	return nil
}

// stop hands the export over: the gauges drop to 0 so that the next
// exporter's values are not added to stale ones.
func (st *statsExport) stop(m *metrics) {
	if !st.exporting {
		return
	}
	st.exporting = false
	m.statsExporter.Add(-1)
	m.pending.Set(0)
	m.parkedRows.Set(0)
	m.oldestPendingAge.Set(0)
}
