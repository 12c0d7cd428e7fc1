package forwarder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/poll"
	retentionjob "github.com/outflow-dev/outflow/internal/retention"
)

// purgeLoop keeps the outbox's partitions ahead of the ids and removes
// published history older than Retention, at start and then every
// PurgeInterval: at start, because a forwarder restarted more often than
// PurgeInterval (a deploy a day, an interval of a day) would otherwise
// never purge. The round is one instance's at a time (its advisory lock)
// and costs a probe when there is nothing to do.
func (f *Forwarder) purgeLoop(ctx context.Context) {
	poll.Every(ctx, f.cfg.PurgeInterval, f.purgeRound, poll.Warn(f.cfg.Logger, "purge published rows"))
}

// purgeRound is one round of purgeLoop: a failure to create partitions
// ahead does not keep it from purging.
func (f *Forwarder) purgeRound(ctx context.Context) error {
	made, perr := EnsurePartitions(ctx, f.cfg.Pool, f.cfg.HistoryPartitionSize)
	if len(made) > 0 {
		f.cfg.Logger.Info("created outbox partitions ahead", "partitions", made)
	}
	n, err := Purge(ctx, f.cfg.Pool, f.cfg.Retention, f.cfg.PurgeBatchSize)
	f.metrics.purged.Add(float64(n))
	if n > 0 {
		f.cfg.Logger.Info("purged published rows", "rows", n, "retention", f.cfg.Retention)
	}
	return errors.Join(perr, err)
}

// historyPartition is one range partition of the outbox: ids in [lo, hi);
// lo is nil for the first (MINVALUE).
type historyPartition struct {
	name   string
	lo, hi *int64
}

var partitionBound = regexp.MustCompile(`^FOR VALUES FROM \((MINVALUE|'?(-?\d+)'?)\) TO \((MAXVALUE|'?(-?\d+)'?)\)$`)

// historyPartitionsSQL lists the outbox's partitions with their bounds, the
// default partition's as DEFAULT.
const historyPartitionsSQL = `
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'outbox'::regclass`

// historyPartitions reads the outbox's range partitions, in id order, and
// whether it has a default partition (named outbox_default by migration
// 00028).
func historyPartitions(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]historyPartition, bool, error) {
	rows, err := q.Query(ctx, historyPartitionsSQL)
	if err != nil {
		return nil, false, err
	}
	var (
		out        []historyPartition
		hasDefault bool
	)
	var name, bound string
	_, err = pgx.ForEachRow(rows, []any{&name, &bound}, func() error {
		if bound == "DEFAULT" {
			hasDefault = true
			return nil
		}
		m := partitionBound.FindStringSubmatch(bound)
		if m == nil {
			return fmt.Errorf("outbox partition %s: unexpected bound %q", name, bound)
		}
		p := historyPartition{name: name}
		if m[2] != "" {
			v, _ := strconv.ParseInt(m[2], 10, 64)
			p.lo = &v
		}
		if m[4] != "" {
			v, _ := strconv.ParseInt(m[4], 10, 64)
			p.hi = &v
		}
		out = append(out, p)
		return nil
	})
	slices.SortFunc(out, func(a, b historyPartition) int {
		switch {
		case a.lo == nil:
			return -1
		case b.lo == nil:
			return 1
		}
		return cmp.Compare(*a.lo, *b.lo)
	})
	return out, hasDefault, err
}

// partitionsAhead is how many whole partitions EnsurePartitions keeps above
// the id sequence.
const partitionsAhead = 2

// EnsurePartitions creates range partitions of the outbox of size ids each
// until at least two whole ones lie above the id sequence, and returns
// their names. One instance at a time does it (the others return nothing).
// Each partition is created on its own with its indexes and then attached,
// which locks out no producer; a lock_timeout of a second keeps it from
// queueing them behind a long transaction (it runs again at the next
// tick). Should ids ever outrun the partitions (no forwarder ran for that
// long), they land in outbox_default and the next partition starts above
// them.
func EnsurePartitions(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, size int64) ([]string, error) {
	if size < 1 {
		return nil, fmt.Errorf("ensure outbox partitions: size %d: must be at least 1", size)
	}
	var made []string
	for {
		var name string
		_, err := advisory.InTx(ctx, pool, advisory.OutboxPartitions, func(tx pgx.Tx) error {
			parts, hasDefault, err := historyPartitions(ctx, tx)
			if err != nil {
				return err
			}
			if len(parts) == 0 || parts[len(parts)-1].hi == nil {
				return nil // not partitioned by 00028, or open-ended: nothing to add
			}
			lo := *parts[len(parts)-1].hi
			var last, overflow int64
			q := `SELECT coalesce(pg_sequence_last_value('outbox_id_seq'), 0), 0::bigint`
			if hasDefault {
				q = `SELECT coalesce(pg_sequence_last_value('outbox_id_seq'), 0), coalesce((SELECT max(id) FROM outbox_default), 0)`
			}
			if err := tx.QueryRow(ctx, q).Scan(&last, &overflow); err != nil {
				return err
			}
			if lo-last >= partitionsAhead*size {
				return nil
			}
			if overflow >= lo {
				lo = max(overflow, last) + 1
			}
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT outbox_add_partition($1, $2)`, lo, lo+size).Scan(&name)
		})
		if err != nil {
			return made, fmt.Errorf("ensure outbox partitions: %w", err)
		}
		if name == "" {
			return made, nil
		}
		made = append(made, name)
	}
}

// Purge removes published history created more than retention ago and
// returns how many rows went. A range partition of the outbox goes whole
// (DROP TABLE: no row deleted, nothing for vacuum) once every row in it is
// published (every lease partition's published_through is at or past its
// last id), none is in outbox_failures (a parked row keeps its partition,
// and the history around it, until it is retried or discarded), and its
// newest row was created before the cutoff; its rows are counted from the
// statistics (reltuples), not read. Rows that landed in outbox_default
// are deleted one by one, in transactions of at most batch rows walking it
// in id order, as before partitioning. Concurrent calls are harmless: only
// one runs, the others return 0.
//
// Each drop and each batch locks outbox_failures in SHARE mode first: a
// repair of the broker audit (or a failure the forwarder records) putting
// a row there commits before it reads the table, or waits for it; a row it
// removed meanwhile is one the repair finds gone, and says so. Dropping
// takes the outbox's exclusive lock for a moment; it waits for it at most
// a fifth of a second (a long transaction on the outbox postpones the drop
// to the next run rather than queueing producers behind it).
//
// Receipts of the broker audit older than retention go too: their rows are
// gone or going, so a loss of them could not be repaired anyway (a
// consumer group that lags behind the retention loses events either way).
//
// So do the bodies by reference (claimcheck.PurgeBodies) of the events
// gone, with the same cutoff, by days dropped whole: a body never goes
// before its event. They are not counted in the rows returned, which are
// the outbox's.
func Purge(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, retention time.Duration, batch int) (int64, error) {
	cutoff := time.Now().Add(-retention)
	var rows int64            // the outbox's: not the receipts'
	skip := map[string]bool{} // partitions kept by a failure: look past them
	job := retentionjob.Job{Name: "published rows", DB: pool, Lock: advisory.ForwarderPurge, Tables: []retentionjob.Table{
		{Name: "outbox partitions", Batch: func(ctx context.Context, tx pgx.Tx, w *retentionjob.Walk) (int64, bool, error) {
			return dropPartition(ctx, tx, w.Cutoff, skip)
		}},
		{Name: "outbox_default", Batch: func(ctx context.Context, tx pgx.Tx, w *retentionjob.Walk) (int64, bool, error) {
			return purgeDefault(ctx, tx, w, batch)
		}},
		{Name: "outbox_receipts", Batch: func(ctx context.Context, tx pgx.Tx, w *retentionjob.Walk) (int64, bool, error) {
			tag, err := tx.Exec(ctx, `
				DELETE FROM outbox_receipts WHERE id IN (
					SELECT id FROM outbox_receipts ORDER BY id LIMIT $2) AND published_at < $1`, w.Cutoff, batch)
			return tag.RowsAffected(), tag.RowsAffected() == int64(batch), err
		}},
	}, Deleted: func(table string, n int64) {
		if table != "outbox_receipts" {
			rows += n
		}
	}}
	if _, err := job.Before(ctx, cutoff); err != nil {
		return rows, err
	}
	_, err := claimcheck.PurgeBodies(ctx, pool, cutoff, batch)
	return rows, err
}

// dropPartition drops, in tx, the oldest range partition Purge may drop,
// and returns its rows (estimated); false when there is none.
func dropPartition(ctx context.Context, tx pgx.Tx, cutoff time.Time, skip map[string]bool) (int64, bool, error) {
	if _, err := tx.Exec(ctx, `LOCK TABLE outbox_failures IN SHARE MODE`); err != nil {
		return 0, false, err
	}
	parts, _, err := historyPartitions(ctx, tx)
	if err != nil {
		return 0, false, err
	}
	var through *int64
	if err := tx.QueryRow(ctx, `SELECT min(published_through) FROM outbox_partitions`).Scan(&through); err != nil {
		return 0, false, err
	}
	// The last partition is never dropped: the id sequence is in it or
	// below it.
	for _, p := range parts[:max(len(parts)-1, 0)] {
		if skip[p.name] {
			continue
		}
		if through == nil || p.hi == nil || *p.hi-1 > *through {
			break // not all published: nor are the later ones
		}
		var newest *time.Time
		var failing bool
		table := pgx.Identifier{p.name}.Sanitize()
		if err := tx.QueryRow(ctx, `SELECT (SELECT created_at FROM `+table+` ORDER BY id DESC LIMIT 1),
			EXISTS (SELECT 1 FROM outbox_failures WHERE ($1::bigint IS NULL OR id >= $1::bigint) AND id < $2)`,
			p.lo, *p.hi).Scan(&newest, &failing); err != nil {
			return 0, false, err
		}
		if newest != nil && !newest.Before(cutoff) {
			break // created after the cutoff: nor are the later ones older
		}
		if failing {
			skip[p.name] = true
			continue
		}
		var rows int64
		if err := tx.QueryRow(ctx, `SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = $1::regclass`, table).Scan(&rows); err != nil {
			return 0, false, err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '200ms'`); err != nil {
			return 0, false, err
		}
		_, err := tx.Exec(ctx, `DROP TABLE `+table)
		return rows, true, err
	}
	return 0, false, nil
}

// purgeDefault deletes, in tx, one batch of the published rows of
// outbox_default created before the cutoff, walking it in id order.
func purgeDefault(ctx context.Context, tx pgx.Tx, w *retentionjob.Walk, batch int) (int64, bool, error) {
	var (
		lastID  *int64
		deleted int64
		reached *bool
		exists  bool
	)
	if err := tx.QueryRow(ctx, `SELECT to_regclass('outbox_default') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE outbox_failures IN SHARE MODE`); err != nil {
		return 0, false, err
	}
	if err := tx.QueryRow(ctx, `
		WITH scan AS (
			SELECT id, aggregate_id, created_at FROM outbox_default WHERE id > $1 ORDER BY id LIMIT $2
		), del AS (
			DELETE FROM outbox_default o USING scan s, outbox_partitions p
			WHERE o.id = s.id AND p.partition = outbox_partition_of(s.id, s.aggregate_id)
			  AND s.id <= p.published_through AND s.created_at < $3
			  AND NOT EXISTS (SELECT 1 FROM outbox_failures f WHERE f.id = s.id)
			RETURNING o.id
		)
		SELECT (SELECT max(id) FROM scan), (SELECT count(*) FROM del), (SELECT bool_or(created_at >= $3) FROM scan)`,
		w.After, batch, w.Cutoff).Scan(&lastID, &deleted, &reached); err != nil {
		return 0, false, err
	}
	if lastID == nil || (reached != nil && *reached) {
		return deleted, false, nil
	}
	w.After = *lastID
	return deleted, true, nil
}
