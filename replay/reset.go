package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Reset chooses what [ResetConsumer] forgets.
type Reset struct {
	// Consumer is the consumer's (handler's) name. Required.
	Consumer string
	// AggregateType is the aggregates' type. Required.
	AggregateType string
	// AggregateIDs are the aggregates, or AllAggregates.
	AggregateIDs []string
	// AllAggregates resets every aggregate of AggregateType. It locks the
	// consumers' version table for the transaction, pausing every
	// consumer's bookkeeping (not only this one's) until it commits.
	AllAggregates bool
	// Also, when set, runs in the reset's transaction after the consumer's
	// rows are forgotten: the place to delete the projection's own rows of
	// these aggregates, so that nothing the consumer commits meanwhile is
	// counted twice or lost (see the package doc).
	Also func(ctx context.Context, tx pgx.Tx) error
}

// Validate reports a Reset that cannot be used, naming the field.
func (r Reset) Validate() error {
	switch {
	case r.Consumer == "":
		return errors.New("consumer reset: Consumer is required")
	case r.AggregateType == "":
		return errors.New("consumer reset: AggregateType is required")
	case r.AllAggregates && len(r.AggregateIDs) > 0:
		return errors.New("consumer reset: give AggregateIDs or AllAggregates, not both")
	case !r.AllAggregates && len(r.AggregateIDs) == 0:
		return errors.New("consumer reset: give AggregateIDs or AllAggregates")
	case slices.Contains(r.AggregateIDs, ""):
		return errors.New("consumer reset: an aggregate id is empty")
	}
	return nil
}

// ResetResult counts what a reset deleted.
type ResetResult struct {
	// Processed is processed_messages rows: messages the consumer will
	// handle again.
	Processed int64
	// Versions is consumer_aggregate_versions rows: aggregates that start
	// again from version 1.
	Versions int64
	// DeadLetters is open (retrying, dead, held) dead letters dropped:
	// the replay delivers their messages again.
	DeadLetters int64
}

// resetAttempts bounds the retries of a reset that lost a deadlock to a
// consumer's transaction.
const resetAttempts = 5

// ResetConsumer makes the consumer forget the aggregates, in one
// transaction: their versions, its processed_messages rows of their
// retained outbox rows, its open dead letters of them, then r.Also. The
// consumer may keep running: the aggregates' version rows are locked
// first (inserted when missing, so that an aggregate the consumer has not
// seen yet is locked too), which waits for the consumer's transactions on
// them and holds off its next ones until the reset commits. Those then
// find no version: a version 1 applies, a later one waits as a gap for the
// replay to bring its predecessors. A deadlock with a consumer's batch is
// retried.
func ResetConsumer(ctx context.Context, pool *pgxpool.Pool, r Reset) (ResetResult, error) {
	if err := r.Validate(); err != nil {
		return ResetResult{}, err
	}
	ids := slices.Clone(r.AggregateIDs)
	slices.Sort(ids) // one lock order for every reset
	ids = slices.Compact(ids)
	for attempt := 1; ; attempt++ {
		res, err := resetOnce(ctx, pool, r, ids)
		var pgErr *pgconn.PgError
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "40P01" && attempt < resetAttempts {
			continue
		}
		return res, err
	}
}

func resetOnce(ctx context.Context, pool *pgxpool.Pool, r Reset, ids []string) (res ResetResult, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var placeholders int64
		if r.AllAggregates {
			// Conflicts with every consumer's upsert of its version:
			// their in-flight transactions finish first, the next wait.
			if _, err := tx.Exec(ctx, `LOCK TABLE consumer_aggregate_versions IN SHARE ROW EXCLUSIVE MODE`); err != nil {
				return fmt.Errorf("lock consumer versions: %w", err)
			}
		} else {
			// Version 0 placeholders lock the aggregates the consumer has
			// no row for; they are deleted below with the others.
			err := tx.QueryRow(ctx, `
				WITH l AS (
					INSERT INTO consumer_aggregate_versions AS c (consumer, aggregate_type, aggregate_id, version)
					SELECT $1, $2, id, 0 FROM unnest($3::text[]) AS id ORDER BY id
					ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET version = c.version
					RETURNING xmax = 0 AS inserted)
				SELECT count(*) FILTER (WHERE inserted) FROM l`, r.Consumer, r.AggregateType, ids).Scan(&placeholders)
			if err != nil {
				return fmt.Errorf("lock consumer versions: %w", err)
			}
		}
		aggregate, outboxAggregate := `aggregate_id = ANY($3::text[])`, `o.aggregate_id = ANY($3::text[])`
		args := []any{r.Consumer, r.AggregateType, ids}
		if r.AllAggregates {
			aggregate, outboxAggregate, args = `true`, `true`, args[:2]
		}
		b := &pgx.Batch{}
		// Published rows through outbox_aggregate_version_idx, pending ones (a
		// row the broker lost, waiting to be published again) through
		// the pending-rows index.
		b.Queue(`DELETE FROM processed_messages p WHERE p.consumer = $1 AND p.message_id IN (
				SELECT o.message_id FROM outbox o
				WHERE o.published_at IS NOT NULL AND o.aggregate_type = $2 AND `+outboxAggregate+`
				UNION ALL
				SELECT o.message_id FROM outbox o
				WHERE o.published_at IS NULL AND o.aggregate_type = $2 AND `+outboxAggregate+`)`, args...).Exec(
			func(ct pgconn.CommandTag) error { res.Processed = ct.RowsAffected(); return nil })
		b.Queue(`DELETE FROM dead_letters WHERE consumer = $1 AND aggregate_type = $2 AND `+aggregate+`
			AND status IN ('retrying', 'dead', 'held')`, args...).Exec(
			func(ct pgconn.CommandTag) error { res.DeadLetters = ct.RowsAffected(); return nil })
		b.Queue(`DELETE FROM consumer_aggregate_versions WHERE consumer = $1 AND aggregate_type = $2 AND `+aggregate, args...).Exec(
			func(ct pgconn.CommandTag) error { res.Versions = ct.RowsAffected() - placeholders; return nil })
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("delete consumer state: %w", err)
		}
		if r.Also != nil {
			if err := r.Also(ctx, tx); err != nil {
				return fmt.Errorf("reset's Also: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return ResetResult{}, fmt.Errorf("consumer reset %q: %w", r.Consumer, err)
	}
	return res, nil
}
