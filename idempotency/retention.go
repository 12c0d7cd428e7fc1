package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// retentionLock keeps the purge to one process per schema at a time ("outd").
const retentionLock = 0x6f757464

// RetentionConfig configures the purge of consumers' bookkeeping.
type RetentionConfig struct {
	// Pool is the consumers' database. Required.
	Pool *pgxpool.Pool
	// Retention is how long resolved or discarded dead_letters rows are
	// kept, and how long processed_messages (no longer written since
	// migration 00026's release) stays after its newest row. Defaults to 15 days, the
	// forwarder's retention of published outbox rows: a duplicate comes
	// either from the broker (an entry delivered but not acknowledged, kept
	// until some consumer acknowledges it) or from the outbox (a row sent
	// again), so it must exceed the longest the broker can hold an
	// unacknowledged entry (the longest outage of every worker, plus the
	// claim idle time), and 15 days matches the oldest row the outbox can
	// still send. At least 1h.
	Retention time.Duration
	// BatchSize bounds one purge transaction of dead_letters. Defaults to
	// 1000.
	BatchSize int
	// Interval is how often Run purges. Defaults to 1m.
	Interval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *RetentionConfig) setDefaults() {
	if c.Retention == 0 {
		c.Retention = 15 * 24 * time.Hour
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.Interval == 0 {
		c.Interval = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *RetentionConfig) validate() error {
	var errs []error
	check := func(ok bool, field, want string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s", field, want))
		}
	}
	check(c.Pool != nil, "Pool", "is required")
	// A floor against a slip of the unit (15m for 15 days): rows must
	// outlive every redelivery, and an hour is already below any real
	// window of a worker outage.
	check(c.Retention >= time.Hour, "Retention", "must be at least 1h")
	check(c.BatchSize >= 1 && c.BatchSize <= 100_000, "BatchSize", "must be between 1 and 100000")
	check(c.Interval > 0, "Interval", "must be positive")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idempotency retention config: %w", err)
	}
	return nil
}

// Retention purges the consumers' bookkeeping that only grows: dead_letters
// rows that are resolved or discarded, once they are older than
// RetentionConfig.Retention, and processed_messages, whole.
//
// processed_messages is what consumers wrote, one row per message, before
// the version row became their only bookkeeping (migration 00026's
// release). Nothing writes it now but a consumer of an earlier release
// still running; nothing reads it to decide. Once its newest row is older
// than the retention, Retention empties it in one TRUNCATE: no row-by-row
// DELETE, no dead tuples, no vacuum to follow, whatever its size. While a
// consumer of an earlier release still writes it, its newest row is
// recent and it is kept whole.
//
// What it never deletes, and why:
//
//   - consumer_aggregate_versions: it is what recognises a redelivery, as
//     a duplicate (the version applied last) or stale (below it), however
//     old. It has one row per (consumer, aggregate), not per message, so it
//     grows with the data, not with the traffic;
//   - open dead_letters rows (retrying, dead, held), whatever their age:
//     they are messages still to apply or waiting for an operator, and
//     what makes a redelivery of a parked message a duplicate.
type Retention struct {
	cfg RetentionConfig
}

// NewRetention validates cfg. Run it next to the consumers; several
// processes may run it: one purges at a time, the others find the lock
// taken and wait for their next round.
func NewRetention(cfg RetentionConfig) (*Retention, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Retention{cfg: cfg}, nil
}

// Run purges at once and then every Interval until ctx is done; it returns
// nil then. A failed round is logged and tried again at the next one.
func (r *Retention) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.PurgeOnce(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("purge consumer bookkeeping", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// purgeDeadLettersSQL walks dead_letters in id order from $1 (the table's
// only ordered index is its primary key; open rows have a partial index of
// their own), deleting the resolved and discarded rows resolved before $2.
// A row is resolved after it was created, so the walk stops at the first
// row created after the cutoff.
const purgeDeadLettersSQL = `
WITH scan AS (
    SELECT id, status, resolved_at, created_at FROM dead_letters WHERE id > $1 ORDER BY id LIMIT $3
), del AS (
    DELETE FROM dead_letters d USING scan s
    WHERE d.id = s.id AND s.status IN ('resolved', 'discarded') AND s.resolved_at < $2
    RETURNING d.id
)
SELECT (SELECT max(id) FROM scan), (SELECT count(*) FROM del), (SELECT bool_or(created_at >= $2) FROM scan)`

// PurgeOnce deletes what has outlived the retention: processed_messages
// whole, in one TRUNCATE, once its newest row has; dead letters in
// transactions of at most BatchSize rows that hold their locks for
// milliseconds. It returns how many rows it deleted from both tables. A
// concurrent call (in this or another process) makes it return 0 at once.
func (r *Retention) PurgeOnce(ctx context.Context) (int, error) {
	cutoff := time.Now().Add(-r.cfg.Retention)
	processed, err := r.purgeProcessed(ctx, cutoff)
	if err != nil {
		return processed, err
	}
	dead, err := r.purgeDeadLetters(ctx, cutoff)
	total := processed + dead
	if total > 0 {
		r.cfg.Logger.Info("purged consumer bookkeeping", "processed_messages", processed, "dead_letters", dead,
			"retention", r.cfg.Retention)
	}
	return total, err
}

// truncateLockTimeout bounds the wait for processed_messages' exclusive
// lock: a consumer of an earlier release writing it holds the TRUNCATE off,
// and the TRUNCATE waiting in the lock queue would hold that consumer off in
// turn. It gives up and tries again at the next round.
const truncateLockTimeout = "1s"

// purgeProcessed empties processed_messages once its newest row is older
// than cutoff. It counts the rows first, outside the lock, which a count of
// a large table would otherwise hold for as long as it scans; under the
// lock it only checks again, by the processed_at index, that no row was
// written meanwhile.
func (r *Retention) purgeProcessed(ctx context.Context, cutoff time.Time) (int, error) {
	var (
		rows   int
		newest *time.Time
	)
	// The newest row first, through processed_messages_processed_at_idx:
	// the table is counted only when it is about to go.
	if err := r.cfg.Pool.QueryRow(ctx, `SELECT max(processed_at) FROM processed_messages`).Scan(&newest); err != nil {
		return 0, fmt.Errorf("purge processed messages: %w", err)
	}
	if newest == nil || !newest.Before(cutoff) {
		return 0, nil
	}
	if err := r.cfg.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&rows); err != nil {
		return 0, fmt.Errorf("purge processed messages: %w", err)
	}
	truncated := false
	_, err := r.batch(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+truncateLockTimeout+`'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE processed_messages IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		var recent bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM processed_messages WHERE processed_at >= $1)`, cutoff).
			Scan(&recent); err != nil {
			return err
		}
		if recent { // written by a consumer of an earlier release since the count
			return nil
		}
		if _, err := tx.Exec(ctx, `TRUNCATE processed_messages`); err != nil {
			return err
		}
		truncated = true
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("purge processed messages: %w", err)
	}
	if !truncated {
		return 0, nil
	}
	return rows, nil
}

func (r *Retention) purgeDeadLetters(ctx context.Context, cutoff time.Time) (int, error) {
	var (
		total int
		after int64 = -1
	)
	for {
		var (
			lastID  *int64
			deleted int
			reached *bool
		)
		acquired, err := r.batch(ctx, func(q pgx.Tx) error {
			return q.QueryRow(ctx, purgeDeadLettersSQL, after, cutoff, r.cfg.BatchSize).Scan(&lastID, &deleted, &reached)
		})
		if err != nil {
			return total, fmt.Errorf("purge dead letters: %w", err)
		}
		total += deleted
		if !acquired || lastID == nil || (reached != nil && *reached) {
			return total, nil
		}
		after = *lastID
	}
}

// batch runs fn in a transaction of its own once it holds the purge lock of
// the current schema; it reports false, without running fn, when another
// session holds it.
func (r *Retention) batch(ctx context.Context, fn func(pgx.Tx) error) (bool, error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	var acquired bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema()))`, retentionLock).
		Scan(&acquired); err != nil {
		return false, err
	}
	if !acquired {
		return false, nil
	}
	if err := fn(tx); err != nil {
		return true, err
	}
	return true, tx.Commit(ctx)
}
