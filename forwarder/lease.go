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

		rows, err := tx.Query(ctx, `
			UPDATE outbox_partitions SET lease_until = now() + make_interval(secs => $2)
			WHERE owner = $1 RETURNING partition`, f.cfg.InstanceID, ttl)
		if err != nil {
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

// unregister hands every partition back and removes this instance.
func (f *Forwarder) unregister(ctx context.Context) error {
	f.setPartitions(nil)
	return pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error {
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
