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

// ReadStats reads the outbox's stats. It scans only pending rows, through
// the partial index, so its cost does not grow with the published history.
func ReadStats(ctx context.Context, pool *pgxpool.Pool) (Stats, error) {
	var s Stats
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE parked_at IS NULL),
		       count(*) FILTER (WHERE parked_at IS NOT NULL),
		       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE parked_at IS NULL)), 0)::float8,
		       (SELECT coalesce(sum(published_total), 0) FROM outbox_partitions)::bigint
		FROM outbox WHERE published_at IS NULL`).Scan(&s.Pending, &s.Parked, &s.OldestPendingAgeSeconds, &s.PublishedTotal)
	if err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
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
		SELECT id, message_id::text, topic, event_type, aggregate_type, aggregate_id, aggregate_version,
		       attempts, coalesce(last_error, ''), created_at, parked_at, discarded_at
		FROM outbox WHERE published_at IS NULL AND parked_at IS NOT NULL
		ORDER BY id LIMIT $1`, limit)
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
// and `$1 = 0` alone would make the id an integer, refused past 2^31. See
// [RetryParked] for why a released row is due at once and its aggregate's
// held rows with it. A row discarded before stays discarded when retried:
// what failed then was its marker.
const releaseParkedSQL = `
	WITH released AS (
		UPDATE outbox SET parked_at = NULL, next_attempt_at = now(), attempts = 0,
		       discarded_at = CASE WHEN $3::boolean THEN now() ELSE discarded_at END
		WHERE published_at IS NULL AND parked_at IS NOT NULL AND ($1::bigint = 0 OR id = $1::bigint) AND ($2::text = '' OR topic = $2::text)
		RETURNING id, aggregate_type, aggregate_id
	), held AS (
		UPDATE outbox h SET next_attempt_at = now()
		FROM (SELECT aggregate_type, aggregate_id, min(id) AS id FROM released GROUP BY 1, 2) r
		WHERE h.aggregate_type = r.aggregate_type AND h.aggregate_id = r.aggregate_id AND h.id > r.id
		  AND h.published_at IS NULL AND h.parked_at IS NULL AND h.next_attempt_at IS NULL
	)
	SELECT count(*) FROM released`

// RetryParked puts the parked rows f chooses back in line with a fresh
// count of attempts. It returns how many rows it released. Nothing is ever
// deleted.
//
// A released row is due at once rather than new: a forwarder's claim may
// have moved its low-water mark past it (and past the later rows of its
// aggregate, held behind it), and finds due rows through the small
// blocked-rows index wherever they are. The held rows are made due too, for
// the same reason; they still go out after the released row, in id order.
// This walks the aggregate's pending rows once: an operator's command, not
// the forwarder's hot path. db is a pool, or a transaction the release
// commits with.
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
// one that was only silent and comes back leases nothing under the new
// count (it logs [ErrPartitionsMismatch]) until restarted with it.
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
			leased  int
			total   int64
			running []string
		)
		if err := tx.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE owner IS NOT NULL AND lease_until > now()), coalesce(sum(published_total), 0)::bigint,
			       ARRAY(SELECT id FROM outbox_forwarders WHERE heartbeat_at > now() - make_interval(secs => $1) ORDER BY id)
			FROM outbox_partitions`, liveWithin.Seconds()).Scan(&leased, &total, &running); err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		if leased > 0 || len(running) > 0 {
			return fmt.Errorf("repartition: %w (%d with a heartbeat within %s: %s; %d partitions leased): "+
				"stop every `outflow forward` and `outflow serve --roles forwarder` process first, then run it again "+
				"(a forwarder that crashed counts as stopped %s after its last heartbeat)",
				ErrForwardersRunning, len(running), liveWithin, strings.Join(running, ", "), leased, liveWithin)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM outbox_partitions`); err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO outbox_partitions (partition, published_total)
			SELECT g, CASE WHEN g = 0 THEN $2 ELSE 0 END FROM generate_series(0, $1 - 1) g`, partitions, total)
		if err != nil {
			return fmt.Errorf("repartition: %w", err)
		}
		return nil
	})
}
