package forwarder

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// purgeLock keeps the purge to one instance at a time ("outp").
const purgeLock = 0x6f757470

// purgeLoop deletes published rows older than Retention.
func (f *Forwarder) purgeLoop(ctx context.Context) {
	t := time.NewTicker(f.cfg.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := Purge(ctx, f.cfg.Pool, f.cfg.Retention, f.cfg.PurgeBatchSize)
		f.metrics.purged.Add(float64(n))
		if err != nil && ctx.Err() == nil {
			f.cfg.Logger.Warn("purge published rows", "error", err.Error())
		} else if n > 0 {
			f.cfg.Logger.Info("purged published rows", "rows", n, "retention", f.cfg.Retention)
		}
	}
}

// Purge deletes rows published and created more than retention ago, in
// transactions of at most batch rows that hold their locks for
// milliseconds, walking the table in id order from its oldest row. A row
// is published once its partition's cursor (published_through) is past it
// and it is not in outbox_failures. It stops at the first row created
// after the cutoff, and never touches a pending, failing or parked row. It
// returns how many rows it deleted. Concurrent calls are harmless: only
// one runs, the others return 0.
//
// Each batch locks outbox_failures in SHARE mode first: a repair of the
// broker audit (or a failure the forwarder records) putting a row there
// commits before the batch reads it, or waits for the batch; a row the
// batch deleted meanwhile is one the repair finds gone, and says so.
// Filtered on what it read before a repair's commit, the batch deleted a
// row just put back: lost.
//
// Receipts of the broker audit older than retention go too: their rows are
// gone or going, so a loss of them could not be repaired anyway (a
// consumer group that lags behind the retention loses events either way).
//
// For very high volumes, partition the outbox by time instead and drop
// whole partitions: see the package documentation.
func Purge(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, retention time.Duration, batch int) (int64, error) {
	var (
		total int64
		after int64 = -1
	)
	cutoff := time.Now().Add(-retention)
	for {
		var (
			lastID   *int64
			deleted  int64
			reached  *bool
			acquired bool
		)
		tx, err := pool.Begin(ctx)
		if err != nil {
			return total, fmt.Errorf("purge: %w", err)
		}
		err = tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema()))`, purgeLock).Scan(&acquired)
		if err == nil && acquired {
			_, err = tx.Exec(ctx, `LOCK TABLE outbox_failures IN SHARE MODE`)
		}
		if err == nil && acquired {
			err = tx.QueryRow(ctx, `
				WITH p AS (
					SELECT partition, published_through, count(*) OVER () AS n FROM outbox_partitions
				), scan AS (
					SELECT id, aggregate_id, created_at FROM outbox WHERE id > $1 ORDER BY id LIMIT $2
				), del AS (
					DELETE FROM outbox o USING scan s, p
					WHERE o.id = s.id AND p.partition = ((hashtextextended(s.aggregate_id, 0) % p.n) + p.n) % p.n
					  AND s.id <= p.published_through AND s.created_at < $3
					  AND NOT EXISTS (SELECT 1 FROM outbox_failures f WHERE f.id = s.id)
					RETURNING o.id
				)
				SELECT (SELECT max(id) FROM scan), (SELECT count(*) FROM del), (SELECT bool_or(created_at >= $3) FROM scan)`,
				after, batch, cutoff).Scan(&lastID, &deleted, &reached)
		}
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return total, fmt.Errorf("purge: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return total, fmt.Errorf("purge: %w", err)
		}
		total += deleted
		if !acquired {
			return total, nil
		}
		if lastID == nil || (reached != nil && *reached) {
			return total, purgeReceipts(ctx, pool, cutoff, batch)
		}
		after = *lastID
	}
}

// purgeReceipts deletes the broker audit's receipts published before
// cutoff, oldest first by their primary key, batch rows a transaction,
// until the oldest left is newer: normally none (the audit settles them
// within an interval), a retention's worth when a consumer group stopped.
func purgeReceipts(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, cutoff time.Time, batch int) error {
	for {
		var n int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `
				DELETE FROM outbox_receipts WHERE id IN (
					SELECT id FROM outbox_receipts ORDER BY id LIMIT $2) AND published_at < $1`, cutoff, batch)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return fmt.Errorf("purge receipts: %w", err)
		}
		if n < int64(batch) {
			return nil
		}
	}
}
