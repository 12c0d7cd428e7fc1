package forwarder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stats describes the outbox as a whole, for alerts and `outflow stats`.
type Stats struct {
	// Pending rows wait to be forwarded (parked rows excluded).
	Pending int64 `json:"pending"`
	// Parked rows failed MaxAttempts times and wait for an operator.
	Parked int64 `json:"parked"`
	// OldestPendingAgeSeconds is the age of the oldest pending row, 0 when
	// none: the one number to alert on.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// PublishedTotal counts every row ever forwarded, purged ones included.
	PublishedTotal int64 `json:"published_total"`
}

// pendingSQL counts, per partition, the rows above its published_through
// that are not in outbox_failures and not published below its
// published_high (an index range scan of the primary key from the lowest
// cursor: what is pending, and what a long transaction keeps the cursor
// from passing, not the history), with the oldest one's creation time. A
// row its partition's holder published since its last lease tick still
// counts, for that long. A row's partition is computed inline from the
// partition set its id falls in (sets: the first set from the lowest id,
// each to the next one's first_id), as outbox_partition_of does: the SQL
// function, called per row, made the count 5x slower (52 vs 10 ms for
// 5,000 pending rows), every stats tick while a backlog waits. Before any
// forwarder made the sets, every row is pending.
const pendingSQL = `
WITH sets AS MATERIALIZED (
    SELECT base, count,
           CASE WHEN first_id = min(first_id) OVER () THEN NULL ELSE first_id END AS lo,
           lead(first_id) OVER (ORDER BY first_id) AS hi
    FROM outbox_partition_sets
)
SELECT count(*), min(o.created_at)
FROM outbox o
LEFT JOIN sets ps ON (ps.lo IS NULL OR o.id >= ps.lo) AND (ps.hi IS NULL OR o.id < ps.hi)
LEFT JOIN outbox_partitions p ON p.partition = ` + partitionOf + `
WHERE o.id > coalesce((SELECT min(published_through) FROM outbox_partitions), 0) AND o.id > coalesce(p.published_through, 0)
  AND NOT coalesce(o.id <= p.published_high AND o.transaction_id <> ALL(p.waiting_xids), false)
  AND NOT EXISTS (SELECT 1 FROM outbox_failures f WHERE f.id = o.id)`

// ReadStats reads the outbox's stats: the rows above the partitions'
// cursors, and the small outbox_failures table. Its cost follows what is
// pending, not the published history.
//
// Without JIT compilation: the pending count's estimated cost follows the
// outbox's size (outbox_partition_sets holds a few rows, too few changes
// for autovacuum ever to analyze it, and the planner then assumes 1,570
// sets), and past jit_above_cost compiling its plan took 0.5 to 1.8 s at a
// million rows, for a read that takes 2 ms.
func ReadStats(ctx context.Context, pool *pgxpool.Pool) (Stats, error) {
	var (
		s             Stats
		pending       int64
		oldest        *time.Time
		failing       int64
		oldestFailing *time.Time
	)
	b := &pgx.Batch{}
	// A batch is one implicit transaction (one Sync): SET LOCAL holds for
	// its statements and ends with it.
	b.Queue(`SET LOCAL jit = off`)
	b.Queue(pendingSQL).QueryRow(func(r pgx.Row) error { return r.Scan(&pending, &oldest) })
	b.Queue(`
		SELECT count(*) FILTER (WHERE f.parked_at IS NULL), count(*) FILTER (WHERE f.parked_at IS NOT NULL),
		       min(o.created_at) FILTER (WHERE f.parked_at IS NULL),
		       (SELECT coalesce(sum(published_total), 0) FROM outbox_partitions)::bigint
		FROM outbox_failures f JOIN outbox o ON o.id = f.id`).QueryRow(func(r pgx.Row) error {
		return r.Scan(&failing, &s.Parked, &oldestFailing, &s.PublishedTotal)
	})
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
	}
	s.Pending = pending + failing
	for _, t := range []*time.Time{oldest, oldestFailing} {
		if t != nil {
			s.OldestPendingAgeSeconds = max(s.OldestPendingAgeSeconds, time.Since(*t).Seconds())
		}
	}
	return s, nil
}

// ParkedRow is a row the forwarder gave up on.
//
// A row with DiscardedAt set was parked again after an operator discarded
// it ([DiscardParked]): what the forwarder gave up on is its discard
// marker, not its event, and a retry sends the marker again.
type ParkedRow struct {
	ID               int64     `json:"id"`
	MessageID        string    `json:"message_id"`
	Topic            string    `json:"topic"`
	EventType        string    `json:"event_type"`
	AggregateType    string    `json:"aggregate_type"`
	AggregateID      string    `json:"aggregate_id"`
	AggregateVersion int64     `json:"aggregate_version"`
	Attempts         int       `json:"attempts"`
	LastError        string    `json:"last_error"`
	CreatedAt        time.Time `json:"created_at"`
	ParkedAt         time.Time `json:"parked_at"`
	// DiscardedAt is when an operator discarded the row, nil when not.
	DiscardedAt *time.Time `json:"discarded_at,omitempty"`
}

// ListParked returns up to limit parked rows, oldest first.
func ListParked(ctx context.Context, pool *pgxpool.Pool, limit int) ([]ParkedRow, error) {
	rows, err := pool.Query(ctx, `
		SELECT o.id, o.message_id::text, o.topic, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version,
		       f.attempts, coalesce(f.last_error, ''), o.created_at, f.parked_at, f.discarded_at
		FROM outbox_failures f JOIN outbox o ON o.id = f.id WHERE f.parked_at IS NOT NULL
		ORDER BY f.id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list parked rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ParkedRow])
	if err != nil {
		return nil, fmt.Errorf("list parked rows: %w", err)
	}
	return out, nil
}

// Querier is what both a pool and a transaction offer. [RetryParked] and
// [DiscardParked] take one so that an operator's tool can run them in its
// own transaction, with the audit record of what it did: both commit, or
// neither.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ParkedFilter chooses parked rows for [RetryParked] and [DiscardParked]:
// the row with ID, or every parked row when ID is 0; a Topic narrows
// either to that topic's rows.
type ParkedFilter struct {
	ID    int64
	Topic string
}

// releaseParkedSQL puts the parked rows $1/$2 choose back in line with a
// fresh count of attempts, discarding them as well when $3. The casts are
// not decoration: PostgreSQL types a parameter where it first meets it,
// and `$1 = 0` alone would make the id an integer, refused past 2^31. A
// row discarded before stays discarded when retried: what failed then was
// its marker. The rows held behind a released one are in outbox_failures
// too, untried: they go out after it, in id order. A discard is also
// written on the outbox row itself (discarded_at, off the normal path):
// the row leaves outbox_failures once its marker is published, and replay
// and the journey must still send and show the marker.
const releaseParkedSQL = `
	WITH released AS (
		UPDATE outbox_failures f SET parked_at = NULL, next_attempt_at = now(), attempts = 0,
		       discarded_at = CASE WHEN $3::boolean THEN now() ELSE f.discarded_at END
		FROM outbox o
		WHERE o.id = f.id AND f.parked_at IS NOT NULL AND ($1::bigint = 0 OR f.id = $1::bigint) AND ($2::text = '' OR o.topic = $2::text)
		RETURNING f.id, f.discarded_at
	), marked AS (
		UPDATE outbox o SET discarded_at = r.discarded_at
		FROM released r WHERE o.id = r.id AND r.discarded_at IS NOT NULL AND o.discarded_at IS NULL
	)
	SELECT count(*) FROM released`

// RetryParked puts the parked rows f chooses back in line with a fresh
// count of attempts: due at once in outbox_failures, where the claim of
// whichever instance holds their partition finds them, the rows held
// behind them following in id order. It returns how many rows it
// released. Nothing is ever deleted. db is a pool, or a transaction the
// release commits with.
func RetryParked(ctx context.Context, db Querier, f ParkedFilter) (int64, error) {
	n, err := releaseParked(ctx, db, f, false)
	if err != nil {
		return 0, fmt.Errorf("retry parked rows: %w", err)
	}
	return n, nil
}

// DiscardParked gives up on the events of the parked rows f chooses: it
// releases them as [RetryParked] does and marks them discarded, in one
// statement, so that the forwarder publishes each one's discard marker
// (see [Message]) in its place. The marker keeps the event's version in
// its aggregate's stream: the consumers apply it without running their
// handler and go on with the aggregate's later events, which a row simply
// dropped would leave waiting for the missing version. It returns how many
// rows it discarded. The row itself is kept, payload and all. db is a
// pool, or a transaction the discard commits with.
func DiscardParked(ctx context.Context, db Querier, f ParkedFilter) (int64, error) {
	n, err := releaseParked(ctx, db, f, true)
	if err != nil {
		return 0, fmt.Errorf("discard parked rows: %w", err)
	}
	return n, nil
}

func releaseParked(ctx context.Context, db Querier, f ParkedFilter, discard bool) (int64, error) {
	if f.ID < 0 {
		return 0, fmt.Errorf("%w: the id must not be negative", ErrInvalidFilter)
	}
	var n int64
	if err := db.QueryRow(ctx, releaseParkedSQL, f.ID, f.Topic, discard).Scan(&n); err != nil {
		return 0, err
	}
	return n, nil
}

// ErrInvalidFilter is returned for a [ParkedFilter] that cannot choose rows.
var ErrInvalidFilter = errors.New("invalid parked-rows filter")

// ErrForwardersRunning is returned by [Repartition] while a forwarder runs.
var ErrForwardersRunning = errors.New("forwarders are running")

// Repartition changes the partition count. It refuses while any forwarder
// runs, leased partitions or not: rows are assigned to partitions by count,
// so changing it under a running forwarder could reorder an aggregate's
// events, and an instance holding no lease yet takes some at its next tick.
// A forwarder runs while its heartbeat (outbox_forwarders) is younger than
// liveWithin, which should be the forwarders' TakeoverAfter (0: its default,
// 10s): one that crashed counts as stopped that long after its last beat;
// one that was only silent and comes back follows the new count. With
// forwarders running, use [RepartitionOnline].
func Repartition(ctx context.Context, pool *pgxpool.Pool, partitions int, liveWithin time.Duration) error {
	if partitions < 1 || partitions > 4096 {
		return fmt.Errorf("repartition: partitions must be between 1 and 4096")
	}
	if liveWithin < 0 {
		return fmt.Errorf("repartition: liveWithin must not be negative")
	}
	if liveWithin == 0 {
		liveWithin = 10 * time.Second
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// EXCLUSIVE also waits for a forwarder registering right now (it
		// locks the table to check the count), which then sees the new one.
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox_partitions IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		var (
			leased         int
			total, through int64
			running        []string
		)
		if err := tx.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE owner IS NOT NULL AND lease_until > now()), coalesce(sum(published_total), 0)::bigint,
			       coalesce(min(published_through), 0),
			       ARRAY(SELECT id FROM outbox_forwarders WHERE heartbeat_at > now() - make_interval(secs => $1) ORDER BY id)
			FROM outbox_partitions`, liveWithin.Seconds()).Scan(&leased, &total, &through, &running); err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		if leased > 0 || len(running) > 0 {
			return fmt.Errorf("repartition: %w (%d with a heartbeat within %s: %s; %d partitions leased): "+
				"stop every `outflow forward` and `outflow serve --roles forwarder` process first, then run it again "+
				"(a forwarder that crashed counts as stopped %s after its last heartbeat)",
				ErrForwardersRunning, len(running), liveWithin, strings.Join(running, ", "), leased, liveWithin)
		}
		// A forwarder counted as stopped may still have a batch out (its
		// heartbeat stalled, not its claims): it finishes first (the
		// fence).
		if err := fenceWait(ctx, tx, `true`); err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM outbox_partitions; DELETE FROM outbox_partition_sets`); err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		// Every new partition starts from the lowest cursor of the old
		// ones: whatever an aggregate's old partition, nothing above it
		// was surely published (what was is published again once).
		_, err := tx.Exec(ctx, `
			INSERT INTO outbox_partitions (partition, published_total, published_through, published_high, published_through_at)
			SELECT g, CASE WHEN g = 0 THEN $2 ELSE 0 END, $3, $3, now() FROM generate_series(0, $1 - 1) g`, partitions, total, through)
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, $1)`, partitions)
		}
		if err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		return nil
	})
}

// ErrRepartitionInProgress is returned by [RepartitionOnline] while a
// change of the partition count it started is not finished.
var ErrRepartitionInProgress = errors.New("a change of the partition count is in progress")

// RepartitionOnline changes the partition count with the forwarders
// running, and returns the id from which rows map to the new partitions.
// The rows below it stay with the old partitions, whose holders publish
// them as before; the rows from it on map to the new ones (a new set,
// numbered past the old), whose cursors start there and which nobody
// leases yet. Once every old partition's recorded cursor has passed the
// last id below it (every row of the old set published, or held in
// outbox_failures, which holds its aggregate's later rows wherever they
// map), a forwarder's lease tick retires the old set and the instances
// lease the new one: an aggregate moving to another partition, and maybe
// another instance, never has a later event published before an earlier
// one. New events wait meanwhile: about two lease intervals, and for as
// long as a transaction that wrote outbox rows before the change stays
// open. It refuses while a previous change is in progress
// ([ErrRepartitionInProgress]). Instances started with another
// Config.Partitions follow the database's count.
func RepartitionOnline(ctx context.Context, pool *pgxpool.Pool, partitions int) (int64, error) {
	if partitions < 1 || partitions > 4096 {
		return 0, fmt.Errorf("repartition: partitions must be between 1 and 4096")
	}
	var from int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// EXCLUSIVE: one change at a time, and none while a forwarder
		// registers the first set; the claims only read the sets.
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox_partition_sets IN EXCLUSIVE MODE`); err != nil {
			return err
		}
		var (
			sets, base, count int
		)
		if err := tx.QueryRow(ctx, `
			SELECT count(*) OVER (), base, count FROM outbox_partition_sets ORDER BY first_id LIMIT 1`).Scan(&sets, &base, &count); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("no partitions yet: start a forwarder with Partitions %d instead", partitions)
			}
			return err
		}
		if sets > 1 {
			return ErrRepartitionInProgress
		}
		// The new set is numbered apart from the old, so that both exist
		// side by side meanwhile: below it when it fits there, after it
		// otherwise.
		newBase := 0
		if partitions > base {
			newBase = base + count
		}
		if err := tx.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value('outbox_id_seq'), 0) + 1`).Scan(&from); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO outbox_partition_sets (first_id, base, count) VALUES ($1, $2, $3)`, from, newBase, partitions); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO outbox_partitions (partition, published_through, published_high, published_through_at)
			SELECT g, $1::bigint - 1, $1::bigint - 1, now() FROM generate_series($2::int, $2::int + $3::int - 1) g`, from, newBase, partitions)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("repartition online: %w", err)
	}
	return from, nil
}

// AuditState is the broker audit's record of one broker topic (a stream,
// a subject): when it was last checked and the last loss it repaired.
type AuditState struct {
	// Mode is "table" for the forwarder's audit, "wal" for the WAL relay's.
	Mode        string    `json:"mode"`
	BrokerTopic string    `json:"broker_topic"`
	Topic       string    `json:"topic"`
	AuditedAt   time.Time `json:"audited_at"`
	// LastLossAt and LastLossReason are nil until the audit found a loss.
	LastLossAt     *time.Time `json:"last_loss_at"`
	LastLossReason *string    `json:"last_loss_reason"`
	// LastRepaired is how many events the last repair published again.
	LastRepaired int64 `json:"last_repaired"`
}

// ReadAuditStates reads the broker audit's record of every broker topic it
// checked, of both modes, ordered by mode and broker topic: empty where no
// audit ran (a broker that is no Auditor, or the audit turned off).
func ReadAuditStates(ctx context.Context, pool *pgxpool.Pool) ([]AuditState, error) {
	rows, err := pool.Query(ctx, `
		SELECT 'table', broker_topic, topic, audited_at, last_loss_at, last_loss_reason, last_repaired FROM outbox_audit
		UNION ALL
		SELECT 'wal', broker_topic, topic, audited_at, last_loss_at, last_loss_reason, last_repaired FROM outbox_wal_audit
		ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("read the broker audit's state: %w", err)
	}
	states, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditState, error) {
		var s AuditState
		err := r.Scan(&s.Mode, &s.BrokerTopic, &s.Topic, &s.AuditedAt, &s.LastLossAt, &s.LastLossReason, &s.LastRepaired)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the broker audit's state: %w", err)
	}
	return states, nil
}
