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
	// Retention is how long processed_messages rows and resolved or
	// discarded dead_letters rows are kept. Defaults to 15 days, the
	// forwarder's retention of published outbox rows: a duplicate comes
	// either from the broker (an entry delivered but not acknowledged, kept
	// until some consumer acknowledges it) or from the outbox (a row sent
	// again), so it must exceed the longest the broker can hold an
	// unacknowledged entry (the longest outage of every worker, plus the
	// claim idle time), and 15 days matches the oldest row the outbox can
	// still send. At least 1h.
	Retention time.Duration
	// BatchSize bounds one purge transaction. Defaults to 1000.
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

// Retention purges the consumers' bookkeeping that only grows:
// processed_messages rows, and dead_letters rows that are resolved or
// discarded, once they are older than RetentionConfig.Retention.
//
// What it never deletes, and why:
//
//   - consumer_aggregate_versions: once a message's processed_messages row
//     is gone, a redelivery of it is recorded as new, and the version check
//     is what still skips it: its version is at or below the stored one, so
//     it is stale (Strict and LatestWins alike) and changes nothing. The
//     table has one row per (consumer, aggregate), not per message, so it
//     grows with the data, not with the traffic;
//   - open dead_letters rows (retrying, dead, held), whatever their age:
//     they are messages still to apply or waiting for an operator; nor the
//     processed_messages row of such a message, so that a redelivery keeps
//     finding it while it waits.
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

// purgeProcessedSQL deletes up to $2 processed_messages rows older than $1,
// oldest first (processed_messages_processed_at_idx), except those of a
// message still open in dead_letters. The exception is in the scan, not in
// the DELETE, so a batch is never filled by rows it keeps: a short batch
// means nothing old is left.
const purgeProcessedSQL = `
WITH scan AS (
    SELECT p.message_id, p.consumer FROM processed_messages p
    WHERE p.processed_at < $1
      AND NOT EXISTS (
          SELECT 1 FROM dead_letters d
          WHERE d.consumer = p.consumer AND d.message_id = p.message_id AND d.status IN ('retrying', 'dead', 'held'))
    ORDER BY p.processed_at
    LIMIT $2
), del AS (
    DELETE FROM processed_messages p USING scan s
    WHERE p.message_id = s.message_id AND p.consumer = s.consumer
    RETURNING 1
)
SELECT (SELECT count(*) FROM scan), (SELECT count(*) FROM del)`

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

// PurgeOnce deletes what has outlived the retention, in transactions of at
// most BatchSize rows that hold their locks for milliseconds, and returns
// how many rows it deleted from both tables. A concurrent call (in this or
// another process) makes it return 0 at once.
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

func (r *Retention) purgeProcessed(ctx context.Context, cutoff time.Time) (int, error) {
	total := 0
	for {
		var scanned, deleted int
		acquired, err := r.batch(ctx, func(q pgx.Tx) error {
			return q.QueryRow(ctx, purgeProcessedSQL, cutoff, r.cfg.BatchSize).Scan(&scanned, &deleted)
		})
		if err != nil {
			return total, fmt.Errorf("purge processed messages: %w", err)
		}
		total += deleted
		if !acquired || scanned < r.cfg.BatchSize {
			return total, nil
		}
	}
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
