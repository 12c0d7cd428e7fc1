package walrelay

import (
	"context"
	"fmt"

	"github.com/outflow-dev/outflow/internal/poll"
)

// statsLoop exports the slot's state on every instance, reader or standby,
// and notices a slot lost while no relay reads it.
func (r *Relay) statsLoop(ctx context.Context) {
	poll.Every(ctx, r.cfg.StatsInterval, r.refreshStats, poll.Warn(r.cfg.Logger, "wal relay stats"))
}

func (r *Relay) refreshStats(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.StatsInterval)
	defer cancel()
	st, err := readSlot(qctx, r.cfg.Pool, r.cfg.SlotName)
	if err != nil {
		return err
	}
	if !st.exists && !st.recorded {
		return nil // not made yet: the reader makes it
	}
	r.metrics.setSlot(st)
	if lerr := st.lostErr(r.cfg.SlotName); lerr != nil {
		r.setSlotErr(lerr)
	} else if !r.Leader() {
		// The reader clears it itself once it reads again.
		r.setSlotErr(nil)
	}
	var parked, held int64
	if err := r.cfg.Pool.QueryRow(qctx, `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL), count(*) FROM outbox_wal_parked`).Scan(&parked, &held); err != nil {
		return fmt.Errorf("count parked rows: %w", err)
	}
	r.metrics.parkedRows.Set(float64(parked))
	r.metrics.heldRows.Set(float64(held))
	return nil
}
