package forwarder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// register checks the partition table against the configuration (creating
// it on first use) and records this instance as live.
func (f *Forwarder) register(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error {
		// Serializes first-time set-up between instances starting together.
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox_partitions IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions`).Scan(&n); err != nil {
			return err
		}
		switch {
		case n == 0:
			if _, err := tx.Exec(ctx, `INSERT INTO outbox_partitions (partition) SELECT generate_series(0, $1 - 1)`, f.cfg.Partitions); err != nil {
				return err
			}
		case n != f.cfg.Partitions:
			return errMismatch(n, f.cfg.Partitions)
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO outbox_forwarders (id) VALUES ($1)
			ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()`, f.cfg.InstanceID)
		return err
	})
	if errors.Is(err, ErrPartitionsMismatch) {
		return err
	}
	if err != nil {
		return fmt.Errorf("register forwarder (has `outflow migrate up` run?): %w", err)
	}
	return nil
}

// leaseLoop keeps this instance's share of the partitions: it renews its
// leases, takes free or expired ones up to its fair share, and gives back
// what exceeds it when instances join.
func (f *Forwarder) leaseLoop(ctx context.Context) {
	t := time.NewTicker(f.cfg.LeaseRenewInterval)
	defer t.Stop()
	defer f.lease.stop()
	for {
		owned, err := f.tickLeases(ctx)
		if ctx.Err() == nil {
			f.lease.note(err)
		}
		switch {
		case err == nil:
			f.setPartitions(owned)
		case ctx.Err() != nil:
			return
		default:
			// Without a renewal the leases run out on their own; stop
			// claiming before they do.
			f.setPartitions(nil)
			f.cfg.Logger.Warn("renew partition leases", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (f *Forwarder) tickLeases(ctx context.Context) ([]int32, error) {
	ttl := f.cfg.TakeoverAfter.Seconds()
	var owned []int32
	err := pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error {
		var live int
		err := tx.QueryRow(ctx, `
			WITH hb AS (
				INSERT INTO outbox_forwarders (id) VALUES ($1)
				ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
			)
			SELECT count(*) + 1 FROM outbox_forwarders
			WHERE heartbeat_at > now() - make_interval(secs => $2) AND id <> $1`,
			f.cfg.InstanceID, ttl).Scan(&live)
		if err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		share := (f.cfg.Partitions + live - 1) / live

		// The renewal records, in the same row versions, how far the
		// cursor published each partition and how many rows it published
		// since the last tick (see saveCursorSQL).
		parts, through, high, waiting, published := f.cursorToSave()
		rows, err := tx.Query(ctx, saveCursorSQL+` RETURNING p.partition`,
			f.cfg.InstanceID, ttl, parts, through, high, waiting, published)
		if err != nil {
			f.cur.published.Add(published)
			return fmt.Errorf("renew leases: %w", err)
		}
		if owned, err = pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
			return fmt.Errorf("renew leases: %w", err)
		}
		// Repartition counts an instance silent for longer than its
		// liveWithin as stopped, so the count may have changed under this
		// one: leasing with the old count would map an aggregate to other
		// partitions than the other instances do. The UPDATE above locks
		// the table against a Repartition until this transaction ends, so
		// the count read now holds for the whole tick.
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions`).Scan(&n); err != nil {
			return fmt.Errorf("count partitions: %w", err)
		}
		if n != f.cfg.Partitions {
			return errMismatch(n, f.cfg.Partitions)
		}

		switch {
		case len(owned) < share:
			// SKIP LOCKED: partitions being taken by another instance right
			// now are not worth waiting for.
			rows, err := tx.Query(ctx, `
				UPDATE outbox_partitions SET owner = $1, lease_until = now() + make_interval(secs => $2)
				WHERE partition IN (
					SELECT partition FROM outbox_partitions
					WHERE owner IS NULL OR lease_until < now()
					ORDER BY partition LIMIT $3
					FOR UPDATE SKIP LOCKED)
				RETURNING partition`, f.cfg.InstanceID, ttl, share-len(owned))
			if err != nil {
				return fmt.Errorf("acquire leases: %w", err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return fmt.Errorf("acquire leases: %w", err)
			}
			owned = append(owned, got...)
		case len(owned) > share:
			// Give back the surplus. The UPDATE waits for our own batch in
			// flight on those partitions (it holds them FOR SHARE).
			rows, err := tx.Query(ctx, `
				UPDATE outbox_partitions SET owner = NULL, lease_until = NULL
				WHERE partition IN (
					SELECT partition FROM outbox_partitions WHERE owner = $1
					ORDER BY partition DESC LIMIT $2)
				RETURNING partition`, f.cfg.InstanceID, len(owned)-share)
			if err != nil {
				return fmt.Errorf("release leases: %w", err)
			}
			released, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return fmt.Errorf("release leases: %w", err)
			}
			owned = without(owned, released)
		}
		// Forget instances long dead, so the table does not grow.
		_, err = tx.Exec(ctx, `DELETE FROM outbox_forwarders WHERE heartbeat_at < now() - make_interval(secs => $1)`, 10*ttl)
		return err
	})
	return owned, err
}

// saveCursorSQL renews this instance's leases ($1, for $2 seconds) and,
// in the same row versions, records each partition's published_through,
// published_high ($3, $4, $5: the cursor's durable points; only ever
// raised) and waiting_xids ($6), and adds the rows published since the
// last save ($7) to the lowest partition's published_total: one small
// update per partition and lease tick, whatever the rows published
// meanwhile.
const saveCursorSQL = `
UPDATE outbox_partitions p SET lease_until = now() + make_interval(secs => $2),
       published_through_at = CASE WHEN coalesce(d.through, -1) > p.published_through OR coalesce(d.high, -1) > p.published_high
                                   THEN now() ELSE p.published_through_at END,
       published_through = greatest(p.published_through, coalesce(d.through, -1)),
       published_high = greatest(p.published_high, coalesce(d.high, -1)),
       waiting_xids = CASE WHEN d.partition IS NULL THEN p.waiting_xids ELSE $6::text[]::xid8[] END,
       published_total = p.published_total + CASE WHEN p.partition = m.low THEN $7::bigint ELSE 0 END
FROM (SELECT min(partition) AS low FROM outbox_partitions WHERE owner = $1) m,
     outbox_partitions o LEFT JOIN unnest($3::int[], $4::bigint[], $5::bigint[]) AS d(partition, through, high) ON d.partition = o.partition
WHERE o.partition = p.partition AND p.owner = $1`

// cursorToSave returns the cursor's durable points, as saveCursorSQL takes
// them, and the rows published since the last save (taken: added back if
// the save fails).
func (f *Forwarder) cursorToSave() (parts []int32, through, high []int64, waiting []string, published int64) {
	if d := f.cur.durable.Load(); d != nil {
		for p, t := range d.through {
			parts = append(parts, p)
			through = append(through, t)
			high = append(high, d.high[p])
		}
		waiting = d.waiting
	}
	if waiting == nil {
		waiting = []string{}
	}
	return parts, through, high, waiting, f.cur.published.Swap(0)
}

// unregister records where the cursor stands, hands every partition back
// and removes this instance.
func (f *Forwarder) unregister(ctx context.Context) error {
	f.setPartitions(nil)
	return pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error {
		parts, through, high, waiting, published := f.cursorToSave()
		if _, err := tx.Exec(ctx, saveCursorSQL, f.cfg.InstanceID, 0, parts, through, high, waiting, published); err != nil {
			f.cur.published.Add(published)
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox_partitions SET owner = NULL, lease_until = NULL WHERE owner = $1`, f.cfg.InstanceID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM outbox_forwarders WHERE id = $1`, f.cfg.InstanceID)
		return err
	})
}

func without(xs, drop []int32) []int32 {
	out := xs[:0:0]
	for _, x := range xs {
		keep := true
		for _, d := range drop {
			if x == d {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, x)
		}
	}
	return out
}
