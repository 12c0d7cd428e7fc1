package forwarder

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/poll"
)

// register checks the partition table against the configuration (creating
// it on first use) and records this instance as live.
func (f *Forwarder) register(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error {
		// Serializes first-time set-up between instances starting
		// together. An advisory lock, not a table lock: a SHARE ROW
		// EXCLUSIVE lock of outbox_partitions, then the insert into
		// outbox_partition_sets, took the two tables in the opposite order
		// to RepartitionOnline (the sets, then the partitions), and an
		// instance starting during a repartition deadlocked with it.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))`, advisory.ForwarderRegister); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions`).Scan(&n); err != nil {
			return err
		}
		// Config.Partitions makes the first set; afterwards the database's
		// count rules (RepartitionOnline changes it under running
		// instances).
		if n == 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox_partitions (partition) SELECT generate_series(0, $1 - 1)`, f.cfg.Partitions); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, $1)`, f.cfg.Partitions); err != nil {
				return err
			}
		}
		// Partitions made by hand, or by a release before the sets: one
		// set of them all.
		if _, err := tx.Exec(ctx, `
			INSERT INTO outbox_partition_sets (first_id, base, count)
			SELECT 0, 0, count(*) FROM outbox_partitions
			WHERE NOT EXISTS (SELECT 1 FROM outbox_partition_sets) HAVING count(*) > 0`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO outbox_forwarders (id) VALUES ($1)
			ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()`, f.cfg.InstanceID)
		return err
	})
	if err != nil {
		return fmt.Errorf("register forwarder (has `outflow migrate up` run?): %w", err)
	}
	return nil
}

// leaseLoop keeps this instance's share of the partitions: it renews its
// leases, takes free or expired ones up to its fair share, and gives back
// what exceeds it when instances join.
func (f *Forwarder) leaseLoop(ctx context.Context) {
	defer f.lease.stop()
	poll.Every(ctx, f.cfg.LeaseRenewInterval, f.leaseRound, poll.Warn(f.cfg.Logger, "partition leases"))
}

// leaseRound is one tick of leaseLoop.
func (f *Forwarder) leaseRound(ctx context.Context) error {
	owned, err := f.tickLeases(ctx)
	if ctx.Err() == nil {
		f.lease.note(err)
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return err // the stop, not a failure
	case err != nil:
		// Without a renewal the leases run out on their own; stop
		// claiming before they do.
		f.setPartitions(nil)
		return fmt.Errorf("renew partition leases: %w", err)
	}
	f.setPartitions(owned)
	if !f.repartitioning.Load() {
		return nil
	}
	retired, err := f.retireSet(ctx)
	if err != nil {
		return fmt.Errorf("retire the old partition set: %w", err)
	}
	if retired {
		f.cfg.Logger.Info("partition count changed: the new set's partitions take over", "instance", f.cfg.InstanceID)
		f.Wake()
	}
	return nil
}

func (f *Forwarder) tickLeases(ctx context.Context) ([]int32, error) {
	ttl := f.cfg.TakeoverAfter.Seconds()
	var (
		owned    []int32
		receipts receiptSet
	)
	f.receipts.saving.Lock()
	defer f.receipts.saving.Unlock()
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
		// The active partition set: the claims serve it alone (see
		// RepartitionOnline), so it alone is leased.
		var base, count int
		var next *int64
		if err := tx.QueryRow(ctx, `
			SELECT base, count, (SELECT min(first_id) FROM outbox_partition_sets WHERE first_id > s.first_id)
			FROM outbox_partition_sets s ORDER BY first_id LIMIT 1`).Scan(&base, &count, &next); err != nil {
			return fmt.Errorf("read the partition set: %w", err)
		}
		f.repartitioning.Store(next != nil)
		share := (count + live - 1) / live

		// The renewal records, in the same row versions, how far the
		// cursor published each partition and how many rows it published
		// since the last tick (see saveCursorSQL).
		parts, through, high, waiting, published := f.cursorToSave()
		// After the cursor: the receipts of every batch it covers.
		receipts = f.receipts.take()
		if err := saveReceipts(ctx, tx, receipts); err != nil {
			f.cur.published.Add(published)
			return err
		}
		rows, err := tx.Query(ctx, saveCursorSQL+` RETURNING p.partition`,
			f.cfg.InstanceID, ttl, parts, through, high, waiting, published)
		if err != nil {
			f.cur.published.Add(published)
			return fmt.Errorf("renew leases: %w", err)
		}
		if owned, err = pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
			return fmt.Errorf("renew leases: %w", err)
		}
		switch {
		case len(owned) < share:
			rows, err := tx.Query(ctx, takeoverSQL, f.cfg.InstanceID, ttl, share-len(owned), base, count)
			if err != nil {
				return fmt.Errorf("acquire leases: %w", err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return fmt.Errorf("acquire leases: %w", err)
			}
			owned = append(owned, got...)
		case len(owned) > share:
			// Give back the surplus, once our own batch in flight on it
			// is done (the fence).
			surplus := slices.Clone(owned)
			slices.Sort(surplus)
			surplus = surplus[share:]
			if err := fenceWait(ctx, tx, `partition = ANY($1::int[])`, surplus); err != nil {
				return fmt.Errorf("release leases: %w", err)
			}
			rows, err := tx.Query(ctx, `
				UPDATE outbox_partitions SET owner = NULL, lease_until = NULL
				WHERE partition = ANY($2::int[]) AND owner = $1
				RETURNING partition`, f.cfg.InstanceID, surplus)
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
	if err != nil {
		f.receipts.add(receipts) // for the next tick, which records the cursor too
	}
	return owned, err
}

// saveReceipts writes s into outbox_receipts, in tx (see receiptSet.queue).
func saveReceipts(ctx context.Context, tx pgx.Tx, s receiptSet) error {
	b := &pgx.Batch{}
	s.queue(b)
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write receipts: %w", err)
	}
	return nil
}

// takeoverSQL leases to instance $1, for $2 seconds, up to $3 partitions
// of the active set ($4, $5 of them) that are free or whose lease ran out.
// The fence is only tried: a partition whose batch is still out (its
// holder's lease ran out under it), or that another instance is taking
// right now, is not worth waiting for. SKIP LOCKED too, for the same
// reason: a lease row another instance's tick is renewing or taking.
// Waiting for it would let two ticks, each holding its own renewals and
// wanting the other's row, deadlock (PostgreSQL would then cancel one,
// and its renewals with it). The outer condition sees a takeover that
// committed since the statement's snapshot.
var takeoverSQL = `
UPDATE outbox_partitions SET owner = $1, lease_until = now() + make_interval(secs => $2)
WHERE partition IN (
    SELECT partition FROM (
        SELECT partition FROM outbox_partitions
        WHERE (owner IS NULL OR lease_until < now()) AND partition >= $4 AND partition < $4 + $5
        ORDER BY partition OFFSET 0
        FOR UPDATE SKIP LOCKED) free
    WHERE pg_try_advisory_xact_lock(` + fenceKey("partition") + `)
    LIMIT $3)
  AND (owner IS NULL OR lease_until < now())
RETURNING partition`

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
	f.receipts.saving.Lock()
	defer f.receipts.saving.Unlock()
	return pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error {
		parts, through, high, waiting, published := f.cursorToSave()
		if err := saveReceipts(ctx, tx, f.receipts.take()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, saveCursorSQL, f.cfg.InstanceID, 0, parts, through, high, waiting, published); err != nil {
			f.cur.published.Add(published)
			return err
		}
		// After the fence: a batch still out finishes first.
		if err := fenceWait(ctx, tx, `owner = $1`, f.cfg.InstanceID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox_partitions SET owner = NULL, lease_until = NULL WHERE owner = $1`, f.cfg.InstanceID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM outbox_forwarders WHERE id = $1`, f.cfg.InstanceID)
		return err
	})
}

// retireSet ends a change of the partition count (RepartitionOnline) once
// its time has come: when every partition of the old set has recorded a
// cursor at or past the last id below the new set's, all of the old set's
// rows are published (or in outbox_failures, which hold their aggregates'
// later rows wherever they map): its partitions go, their published_total
// with the new set's first, and the new set becomes the one the claims
// serve and the instances lease. One instance does it, in a transaction of
// its own, after its lease tick; a claim in flight on an old partition
// holds it back until it commits (the fence).
func (f *Forwarder) retireSet(ctx context.Context) (bool, error) {
	var retired bool
	err := pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error {
		if acquired, err := advisory.Try(ctx, tx, advisory.RetireSet); err != nil || !acquired {
			return err
		}
		var (
			first      int64
			base, cnt  int
			upto, thru *int64
			nextBase   *int
		)
		if err := tx.QueryRow(ctx, `
			WITH ps AS (SELECT first_id, base, count FROM outbox_partition_sets ORDER BY first_id LIMIT 1)
			SELECT ps.first_id, ps.base, ps.count, nx.first_id, nx.base,
			       (SELECT min(published_through) FROM outbox_partitions WHERE partition >= ps.base AND partition < ps.base + ps.count)
			FROM ps LEFT JOIN LATERAL (SELECT first_id, base FROM outbox_partition_sets WHERE first_id > ps.first_id
			                           ORDER BY first_id LIMIT 1) nx ON true`).Scan(&first, &base, &cnt, &upto, &nextBase, &thru); err != nil {
			return err
		}
		if upto == nil || thru == nil || *thru < *upto-1 {
			return nil
		}
		// A claim still out on an old partition finishes first (the
		// fence); one after it finds the partition gone.
		if err := fenceWait(ctx, tx, `partition >= $1 AND partition < $1 + $2`, base, cnt); err != nil {
			return err
		}
		var total int64
		if err := tx.QueryRow(ctx, `
			WITH gone AS (DELETE FROM outbox_partitions WHERE partition >= $1 AND partition < $1 + $2 RETURNING published_total)
			SELECT coalesce(sum(published_total), 0)::bigint FROM gone`, base, cnt).Scan(&total); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox_partitions SET published_total = published_total + $1 WHERE partition = $2`, total, *nextBase); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM outbox_partition_sets WHERE first_id = $1`, first); err != nil {
			return err
		}
		retired = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("retire the old partition set: %w", err)
	}
	return retired, nil
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
