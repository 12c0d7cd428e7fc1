package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DeadLetter is a message a consumer set aside, as `outflow dlq list` shows it.
type DeadLetter struct {
	ID               int64      `json:"id"`
	Consumer         string     `json:"consumer"`
	MessageID        string     `json:"message_id"`
	EventType        string     `json:"event_type"`
	AggregateType    string     `json:"aggregate_type"`
	AggregateID      string     `json:"aggregate_id"`
	AggregateVersion int64      `json:"aggregate_version"`
	Status           string     `json:"status"`
	Reason           string     `json:"reason"`
	Error            string     `json:"error"`
	Attempts         int        `json:"attempts"`
	NextAttemptAt    *time.Time `json:"next_attempt_at"`
	CreatedAt        time.Time  `json:"created_at"`
}

// ListDeadLetters returns open dead letters (retrying, dead, held),
// oldest first; consumer "" lists every consumer's.
func ListDeadLetters(ctx context.Context, pool *pgxpool.Pool, consumer string, limit int) ([]DeadLetter, error) {
	rows, err := pool.Query(ctx, listDeadLettersSQL(consumer != ""), pgx.NamedArgs{"consumer": consumer, "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// listDeadLettersSQL is ListDeadLetters' query, of every consumer or of
// @consumer: one branch per open status, each an ordered scan of a partial
// index of open dead letters that stops after @limit rows (migration
// 00020: dead_letters_open_consumer_status_idx with a consumer,
// dead_letters_open_status_idx without), merged in id order. One condition
// over the three statuses reads and sorts every open row. Literal
// statuses, so that each branch is within the indexes' predicate in a
// generic plan too.
func listDeadLettersSQL(byConsumer bool) string {
	cond := ""
	if byConsumer {
		cond = " AND consumer = @consumer"
	}
	branches := make([]string, 0, 3)
	for _, status := range []string{"retrying", "dead", "held"} {
		branches = append(branches, `(SELECT id, consumer, message_id::text, event_type, aggregate_type, aggregate_id,
		       aggregate_version, status, reason, error, attempts, next_attempt_at, created_at
		FROM dead_letters WHERE status = '`+status+`'`+cond+` ORDER BY id LIMIT @limit)`)
	}
	return `SELECT * FROM (` + strings.Join(branches, " UNION ALL ") + `) d ORDER BY id LIMIT @limit`
}

// DB is what both a pool and a transaction offer. [RetryDeadLetter] and
// [DiscardDeadLetter] take one so that an operator's tool can run them in
// its own transaction, with the audit record of what it did: both commit,
// or neither. In a transaction, DiscardDeadLetter works in a savepoint, so
// a dead letter that is not dead leaves the caller's transaction usable.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ErrNotDead is returned when retry or discard names a row that is not dead.
var ErrNotDead = errors.New("dead letter not found or not dead")

// RetryDeadLetter puts a dead message (id, or every dead one of consumer
// when id is 0) back in line with a fresh attempt count: the consumer's Run
// tries it at once. It returns how many rows it released. (The casts keep
// the id a bigint: `$2 = 0` alone would type it integer.)
func RetryDeadLetter(ctx context.Context, db DB, consumer string, id int64) (int64, error) {
	tag, err := db.Exec(ctx, `
		UPDATE dead_letters SET status = 'retrying', attempts = 0, next_attempt_at = now()
		WHERE status = 'dead' AND ($1::text = '' OR consumer = $1::text) AND ($2::bigint = 0 OR id = $2::bigint)`, consumer, id)
	if err != nil {
		return 0, fmt.Errorf("retry dead letters: %w", err)
	}
	if id != 0 && tag.RowsAffected() == 0 {
		return 0, fmt.Errorf("dead letter %d: %w", id, ErrNotDead)
	}
	return tag.RowsAffected(), nil
}

// DiscardDeadLetter gives up on a dead message: it is recorded as handled
// (its aggregate's version moves past it) without running the handler, and
// the events held behind it are released in order. Nothing is deleted.
func DiscardDeadLetter(ctx context.Context, db DB, id int64) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var consumer, aggType, aggID string
		var version int64
		err := tx.QueryRow(ctx, `
			UPDATE dead_letters SET status = 'discarded', resolved_at = now()
			WHERE id = $1 AND status = 'dead'
			RETURNING consumer, aggregate_type, aggregate_id, aggregate_version`, id).Scan(&consumer, &aggType, &aggID, &version)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("dead letter %d: %w", id, ErrNotDead)
		}
		if err != nil {
			return fmt.Errorf("discard dead letter: %w", err)
		}
		_, err = tx.Exec(ctx, `
			INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version) VALUES ($1, $2, $3, $4)
			ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
			SET version = greatest(consumer_aggregate_versions.version, excluded.version), updated_at = now()`,
			consumer, aggType, aggID, version)
		if err != nil {
			return fmt.Errorf("discard dead letter: %w", err)
		}
		return nil
	})
}
