package idempotency

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/retention"
)

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
	retention.Defaults(&c.BatchSize, &c.Interval, &c.Logger)
}

func (c *RetentionConfig) validate() error {
	var errs configcheck.Errors
	errs.Check(c.Pool != nil, "Pool", "is required")
	// A floor against a slip of the unit (15m for 15 days): rows must
	// outlive every redelivery, and an hour is already below any real
	// window of a worker outage.
	errs.Check(c.Retention >= time.Hour, "Retention", "must be at least 1h")
	retention.Check(&errs, c.BatchSize, c.Interval)
	return errs.Err("idempotency retention config")
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
//     what makes a redelivery of a dead letter a duplicate.
type Retention struct {
	job retention.Job
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
	r := &Retention{cfg: cfg}
	r.job = retention.Job{Name: "consumer bookkeeping", DB: cfg.Pool, Lock: advisory.ConsumerRetention,
		Retention: cfg.Retention, Logger: cfg.Logger, Tables: []retention.Table{
			{Name: "processed_messages", Batch: truncateProcessed},
			{Name: "dead_letters", Batch: r.purgeDeadLetters},
		}}
	return r, nil
}

// Run purges at once and then every Interval until ctx is done; it returns
// nil then. A failed round is logged and tried again at the next one.
func (r *Retention) Run(ctx context.Context) error {
	r.job.Run(ctx, r.cfg.Interval)
	return nil
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
	n, err := r.job.Once(ctx)
	return int(n), err
}

// truncateLockTimeout bounds the wait for processed_messages' exclusive
// lock: a consumer of an earlier release writing it holds the TRUNCATE off,
// and the TRUNCATE waiting in the lock queue would hold that consumer off in
// turn. It gives up and tries again at the next round.
const truncateLockTimeout = "1s"

// truncateProcessed empties processed_messages once its newest row is
// older than the cutoff. It counts the rows before it takes the table's
// exclusive lock, which a count of a large table would otherwise hold for
// as long as it scans; under the lock it only checks again, by the
// processed_at index, that no row was written meanwhile.
func truncateProcessed(ctx context.Context, tx pgx.Tx, w *retention.Walk) (int64, bool, error) {
	var (
		rows   int64
		newest *time.Time
		recent bool
	)
	// The newest row first, through processed_messages_processed_at_idx:
	// the table is counted only when it is about to go.
	if err := tx.QueryRow(ctx, `SELECT max(processed_at) FROM processed_messages`).Scan(&newest); err != nil {
		return 0, false, err
	}
	if newest == nil || !newest.Before(w.Cutoff) {
		return 0, false, nil
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&rows); err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+truncateLockTimeout+`'`); err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE processed_messages IN ACCESS EXCLUSIVE MODE`); err != nil {
		return 0, false, err
	}
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM processed_messages WHERE processed_at >= $1)`, w.Cutoff).
		Scan(&recent); err != nil || recent { // recent: written by a consumer of an earlier release since the count
		return 0, false, err
	}
	_, err := tx.Exec(ctx, `TRUNCATE processed_messages`)
	return rows, false, err
}

// purgeDeadLetters deletes one batch of the walk of dead_letters.
func (r *Retention) purgeDeadLetters(ctx context.Context, tx pgx.Tx, w *retention.Walk) (int64, bool, error) {
	var (
		lastID  *int64
		deleted int64
		reached *bool
	)
	if err := tx.QueryRow(ctx, purgeDeadLettersSQL, w.After, w.Cutoff, r.cfg.BatchSize).Scan(&lastID, &deleted, &reached); err != nil {
		return 0, false, err
	}
	if lastID == nil || (reached != nil && *reached) {
		return deleted, false, nil
	}
	w.After = *lastID
	return deleted, true, nil
}
