package walrelay

import (
	"context"
	"time"
)

// statsLoop exports the slot's state on every instance, reader or standby,
// and notices a slot lost while no relay reads it.
func (r *Relay) statsLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		r.refreshStats(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Relay) refreshStats(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.StatsInterval)
	defer cancel()
	st, err := readSlot(qctx, r.cfg.Pool, r.cfg.SlotName)
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("wal relay stats", "error", err.Error())
		}
		return
	}
	if !st.exists && !st.recorded {
		return // not made yet: the reader makes it
	}
	r.metrics.setSlot(st)
	if lerr := st.lostErr(r.cfg.SlotName); lerr != nil {
		r.setSlotErr(lerr)
	} else if !r.Leader() {
		// The reader clears it itself once it reads again.
		r.setSlotErr(nil)
	}
	var parked, held int64
	if err := r.cfg.Pool.QueryRow(qctx, `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL), count(*) FROM outbox_wal_parked`).Scan(&parked, &held); err == nil {
		r.metrics.parkedRows.Set(float64(parked))
		r.metrics.heldRows.Set(float64(held))
	}
}
