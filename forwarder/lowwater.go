package forwarder

import (
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// lowWater is the claim's low-water mark and the horizon round that moves
// it (see "Claim cost" in the package doc). Only the work loop, through
// forwardBatch, touches it: no lock (resetFrom, which the audit loop
// writes, is atomic).
type lowWater struct {
	// mark: no row with an id <= mark is claimable, except through the
	// blocked-rows index (rows waiting for their retry, or put back by
	// RetryParked). The claim starts above it.
	mark int64
	// A horizon round: s0 is the id sequence's last value, x0 a transaction
	// id taken after s0 was read. Once the oldest running transaction is
	// newer than x0, every transaction that drew an id <= s0 has ended.
	round bool
	s0    int64
	x0    string // xid8, as text
	// claimed: the last batch claimed rows, so the mark may be behind.
	// An idle forwarder opens no round (a round costs a transaction id).
	claimed bool
	// lastFull is when a claim last ignored the mark: the safety net.
	lastFull time.Time
	// seen mirrors mark for readers outside the work loop (tests).
	seen atomic.Int64
	// resetFrom is the lowest id asked for by resetBelow since the last
	// claim, 0 when none: the audit loop's way into the work loop's state,
	// applied at the start of the next claim.
	resetFrom atomic.Int64
}

// resetBelow makes the next claim start below id (ids start at 1): rows
// from id on were published, then put back by a repair
// (forwarder/audit_loop.go), and the mark may have passed them. Safe from
// any goroutine; the lowest request wins.
func (lw *lowWater) resetBelow(id int64) {
	id = max(id, 1)
	for {
		cur := lw.resetFrom.Load()
		if cur != 0 && cur <= id {
			return
		}
		if lw.resetFrom.CompareAndSwap(cur, id) {
			return
		}
	}
}

// seqLastValueSQL and currentXidSQL open a round, in this order: x0 must be
// taken after s0 is read. pg_current_xact_id assigns this transaction's id,
// later than any assigned before; the transaction must not have one yet.
const (
	seqLastValueSQL = `SELECT coalesce(pg_sequence_last_value('outbox_id_seq'), 0)`
	currentXidSQL   = `SELECT pg_current_xact_id()::text`
)

// advanceSQL closes a round when every transaction up to x0 ($1) has ended,
// and then finds the smallest id above the mark ($2) that the first claim
// branch is responsible for: a pending row neither blocked itself nor held
// behind a parked row. Rows held behind a row waiting for its retry count
// (they are found above the mark when it is published); rows held behind a
// parked row do not: RetryParked moves them to the blocked index. The
// initplan under CASE runs only when the round is closed.
const advanceSQL = `
SELECT x.done, CASE WHEN x.done THEN (
    SELECT o.id FROM outbox o
    WHERE o.published_at IS NULL AND o.id > $2 AND o.parked_at IS NULL AND o.next_attempt_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM outbox b
          WHERE b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id AND b.id < o.id
            AND b.published_at IS NULL AND b.parked_at IS NOT NULL)
    ORDER BY o.id LIMIT 1) END
FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) > $1::xid8 AS done) x`

// lowWaterStep is what one claim transaction does for the mark.
type lowWaterStep struct {
	from    int64 // the claim starts above this id
	full    bool
	advance bool // advanceSQL queued
	done    bool
	next    *int64
	open    bool // a round opened
	s0      int64
	x0      string
}

// queue adds the mark's statements to the claim transaction's batch, before
// the claim. It closes an open round, or opens one when the last batch
// claimed rows; never both (a round's x0 must be the transaction's first id).
func (lw *lowWater) queue(b *pgx.Batch, now time.Time, fullEvery time.Duration) *lowWaterStep {
	// A reset lowers the mark before anything reads it. An open round may
	// stay open: its advance looks above the lowered mark, so it cannot
	// carry the mark past the rows put back.
	if r := lw.resetFrom.Swap(0); r != 0 && r-1 < lw.mark {
		lw.mark = r - 1
		lw.seen.Store(lw.mark)
	}
	st := &lowWaterStep{from: lw.mark}
	if now.Sub(lw.lastFull) >= fullEvery {
		st.full, st.from = true, 0
	}
	switch {
	case lw.round:
		st.advance = true
		b.Queue(advanceSQL, lw.x0, lw.mark).QueryRow(func(r pgx.Row) error { return r.Scan(&st.done, &st.next) })
	case lw.claimed:
		st.open = true
		b.Queue(seqLastValueSQL).QueryRow(func(r pgx.Row) error { return r.Scan(&st.s0) })
		b.Queue(currentXidSQL).QueryRow(func(r pgx.Row) error { return r.Scan(&st.x0) })
	}
	return st
}

// apply records what the batch's statements found. It needs no commit: the
// statements only read state other transactions committed.
func (lw *lowWater) apply(st *lowWaterStep, now time.Time, claimed int) {
	if st.full {
		lw.lastFull = now
	}
	lw.claimed = claimed > 0
	switch {
	case st.advance && st.done:
		m := lw.s0
		if st.next != nil {
			m = min(m, *st.next-1)
		}
		lw.mark = max(lw.mark, m)
		lw.seen.Store(lw.mark)
		lw.round = false
	case st.open:
		lw.round, lw.s0, lw.x0 = true, st.s0, st.x0
	}
}
