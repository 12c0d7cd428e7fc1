package walrelay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/internal/poll"
)

// bodiesBatch is how many rows of the bodies' default partition one
// transaction of the purge deletes.
const bodiesBatch = 1000

// bodiesDayMargin: a body is created at its transaction's start, and no
// transaction lives a day, so one created a day before a moment T was
// committed by T.
const bodiesDayMargin = 24 * time.Hour

// bodiesLoop purges the bodies by reference past HistoryRetention every
// pruneTick, on its own schedule: the reader never waits for it. It runs
// on every instance; claimcheck.PurgeBodies lets one at a time work.
func (r *Relay) bodiesLoop(ctx context.Context) {
	var marks relayMarks // this goroutine's own
	poll.Every(ctx, pruneTick, func(ctx context.Context) error { return r.purgeBodies(ctx, &marks, time.Now()) },
		poll.Warn(r.cfg.Logger, "wal relay: purge bodies by reference past retention"))
}

// purgeBodies runs one purge of the bodies at now. In WAL mode the outbox
// holds no row of a relayed event, so the purge's check (outbox, parked
// events) cannot see an event the slot has not confirmed yet: after an
// outage the oldest unrelayed events may be past the retention. So the
// cutoff is also at most a day before the last moment whose WAL the slot
// has confirmed (relayMarks): every transaction that wrote a body before
// it has been relayed (or parked, which keeps its body). Until the slot
// confirms a first mark (a relay just started, or behind), nothing goes.
func (r *Relay) purgeBodies(ctx context.Context, marks *relayMarks, now time.Time) error {
	var walEnd, confirmed int64
	err := r.cfg.Pool.QueryRow(ctx, `
		SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database() AND confirmed_flush_lsn IS NOT NULL`,
		r.cfg.SlotName).Scan(&walEnd, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no slot yet: nothing relayed, nothing to purge
	}
	if err != nil {
		return err
	}
	relayed, ok := marks.observe(now, walEnd, confirmed)
	if !ok {
		r.cfg.Logger.Info("wal relay: bodies by reference not purged: the slot has not confirmed the WAL of a previous run yet")
		return nil
	}
	cutoff := bodiesCutoff(now.Add(-r.cfg.HistoryRetention), relayed)
	st, err := claimcheck.PurgeBodies(ctx, r.cfg.Pool, cutoff, bodiesBatch)
	if st.Dropped > 0 || st.Deleted > 0 || len(st.Skipped) > 0 {
		r.cfg.Logger.Info("wal relay: bodies by reference purged past retention", "days_dropped", st.Dropped,
			"default_rows", st.Deleted, "skipped_locked", st.Skipped)
	}
	return err
}

// bodiesCutoff is the bodies' cutoff: the retention's, and at most a day
// before the moment the slot has relayed everything committed before.
func bodiesCutoff(retention, relayed time.Time) time.Time {
	if c := relayed.Add(-bodiesDayMargin); c.Before(retention) {
		return c
	}
	return retention
}

// relayMark is the WAL's end (bytes from 0/0) at a moment.
type relayMark struct {
	at  time.Time
	wal int64
}

// relayMarks remembers the WAL's end at each purge, until the slot
// confirms it.
type relayMarks struct {
	marks []relayMark
}

// observe records the WAL's end at now and returns the latest moment
// whose WAL's end the slot's confirmed position has reached: everything
// committed before it is relayed. ok is false when there is none yet.
func (m *relayMarks) observe(now time.Time, walEnd, confirmed int64) (time.Time, bool) {
	m.marks = append(m.marks, relayMark{at: now, wal: walEnd})
	i := 0
	for i < len(m.marks) && m.marks[i].wal <= confirmed {
		i++
	}
	if i == 0 {
		return time.Time{}, false
	}
	at := m.marks[i-1].at
	m.marks = m.marks[i-1:] // the latest confirmed one stays: a floor for the next runs
	return at, true
}
