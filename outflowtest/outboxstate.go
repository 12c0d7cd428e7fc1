package outflowtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// OutboxAsSeen is a subquery, named outbox, that gives the outbox's rows
// with the forwarder's state under the names the outbox had before
// migration 00025 (published_at, attempts, last_error, next_attempt_at,
// parked_at, discarded_at) plus state, read from the view outbox_state:
//
//	SELECT count(*) FROM `+outflowtest.OutboxAsSeen+` WHERE published_at IS NULL
//
// The forwarder no longer writes to a row it publishes: published_at is
// when the row's partition's cursor last moved (published_by, an upper
// bound of the publish time), and a row reads published only from the
// forwarder's next lease tick after it published it. For the tests: it
// reads the whole outbox.
const OutboxAsSeen = `(SELECT o.id, o.message_id, o.topic, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.event_type,
       o.created_at, o.occurred_at,
       CASE WHEN s.published THEN coalesce(s.published_by, now()) END AS published_at,
       s.attempts, s.last_error, s.next_attempt_at, s.parked_at, s.discarded_at, s.state
FROM outbox o JOIN outbox_state s USING (id)) outbox`

// Execer is what a pool, a connection and a transaction offer.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PublishThrough marks the outbox rows with an id at or below id
// published, as a forwarder records it at its lease tick: it moves every
// partition's cursor (published_through, published_high) up to id, never
// back, and sets published_through_at to now. With no partition yet (no
// forwarder ran on the schema) it creates the forwarder's default 16. For
// tests that set up the outbox's state without a forwarder; a forwarder
// running on the schema records its own cursors over these.
func PublishThrough(ctx context.Context, db Execer, id int64) error {
	if _, err := db.Exec(ctx, `
		WITH none AS (INSERT INTO outbox_partitions (partition, published_through, published_high, published_through_at)
		              SELECT g, $1, $1, now() FROM generate_series(0, 15) g
		              WHERE NOT EXISTS (SELECT 1 FROM outbox_partitions)),
		     sets AS (INSERT INTO outbox_partition_sets (first_id, base, count)
		              SELECT 0, 0, 16 WHERE NOT EXISTS (SELECT 1 FROM outbox_partitions))
		UPDATE outbox_partitions SET published_through = greatest(published_through, $1),
		       published_high = greatest(published_high, $1), published_through_at = now()`, id); err != nil {
		return fmt.Errorf("publish the outbox through %d: %w", id, err)
	}
	return nil
}

// ParkRow parks the outbox row id as the forwarder does once MaxAttempts
// were spent: a failed row of outbox_failures with parked_at set, attempts
// and lastError.
func ParkRow(ctx context.Context, db Execer, id int64, attempts int, lastError string) error {
	tag, err := db.Exec(ctx, `
		INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, last_error, parked_at)
		SELECT id, aggregate_type, aggregate_id, 'failed', $2, $3, now() FROM outbox WHERE id = $1`, id, attempts, lastError)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("no outbox row")
	}
	if err != nil {
		return fmt.Errorf("park outbox row %d: %w", id, err)
	}
	return nil
}

// SeedOutboxStates fills an empty outbox with rows in every state of the
// view outbox_state, each case of its rule: 8 transactions of 10 rows
// (aggregates a0..a9) over 4 partitions whose cursors stop at different
// points, published_through below published_high with the 6th transaction
// waiting, and rows of outbox_failures of each kind, parked too. For the
// tests of readers that write the view's rule out, to compare them with
// the view.
func SeedOutboxStates(ctx context.Context, db interface {
	Execer
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) error {
	for tx := range 8 {
		if _, err := db.Exec(ctx, `
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			SELECT gen_random_uuid(), 't', 'a', 'a' || i, $1 + 1, 'e', '{}', now() FROM generate_series(0, 9) i`, tx); err != nil {
			return fmt.Errorf("seed outbox states: %w", err)
		}
	}
	var low int64
	if err := db.QueryRow(ctx, `SELECT min(id) - 1 FROM outbox`).Scan(&low); err != nil {
		return fmt.Errorf("seed outbox states: %w", err)
	}
	// Partition g: published through the (g+2)th transaction's rows, high
	// through the 7th's but for the 6th's, which waits.
	if _, err := db.Exec(ctx, `
		INSERT INTO outbox_partitions (partition, published_through, published_high, waiting_xids, published_through_at)
		SELECT g, $1 + 10 * (g + 2), $1 + 70,
		       ARRAY(SELECT DISTINCT transaction_id FROM outbox WHERE id > $1 + 50 AND id <= $1 + 60), now()
		FROM generate_series(0, 3) g`, low); err != nil {
		return fmt.Errorf("seed outbox states: %w", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 4)`); err != nil {
		return fmt.Errorf("seed outbox states: %w", err)
	}
	if _, err := db.Exec(ctx, `
		INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, last_error, next_attempt_at, parked_at)
		SELECT id, aggregate_type, aggregate_id, k.kind, k.attempts, k.err, now(), CASE WHEN k.parked THEN now() END
		FROM outbox o JOIN (VALUES (3, 'failed', 2, 'refused', false), (13, 'failed', 5, 'refused', true), (14, 'held', 0, NULL, false),
		                           (25, 'repair', 0, NULL, false), (75, 'failed', 1, 'refused', false))
		     AS k(n, kind, attempts, err, parked) ON o.id = $1 + k.n`, low); err != nil {
		return fmt.Errorf("seed outbox states: %w", err)
	}
	return nil
}
