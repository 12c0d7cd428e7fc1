package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

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

// ResetResult counts what a reset forgot.
type ResetResult struct {
	// Processed is processed_messages rows deleted: messages a consumer
	// of a release before migration 00026 (which wrote a row per message)
	// will handle again. Consumers since decide by the version alone: 0
	// once the table is empty.
	Processed int64
	// Versions is aggregates whose applied version went back to 0: they
	// start again from version 1.
	Versions int64
	// DeadLetters is open (retrying, dead, held) dead letters dropped:
	// the replay delivers their messages again.
	DeadLetters int64
	// Purged is aggregates whose history the outbox no longer holds from
	// version 1 (retention purged their first versions, or all of them):
	// a replay cannot rebuild them. After the reset, their first event to
	// arrive waits as a gap and is dead-lettered after the consumer's
	// GapTimeout, never taken as a baseline. PurgedIDs names the first
	// ten of them, in id order.
	Purged    int64
	PurgedIDs []string
}

// purgedSample is how many purged aggregates ResetResult names.
const purgedSample = 10

// resetAttempts bounds the retries of a reset that lost a deadlock to a
// consumer's transaction.
const resetAttempts = 5

// ResetConsumer makes the consumer forget the aggregates, in one
// transaction: their versions (the consumer's only bookkeeping), its open
// dead letters of them, the processed_messages rows of their retained
// outbox rows that a consumer of a release before migration 00026 may
// still have written, then r.Also. The
// consumer may keep running: the aggregates' version rows are written
// first (inserted when missing, so that an aggregate the consumer has not
// seen yet is locked too), which waits for the consumer's transactions on
// them and holds off its next ones until the reset commits.
//
// A version row is not deleted but set back to version 0 and marked reset
// (consumer_aggregate_versions.reset_at), so that the aggregate's history
// starts again at version 1 whatever the consumer's
// idempotency.Config.BaselineBefore: a version 1 applies, a later one
// waits as a gap for the replay to bring its predecessors, is never taken
// as the aggregate's baseline, and is dead-lettered (reason gap, healed
// when the predecessor applies) if the replay comes after GapTimeout.
// Deleted, the row would make the aggregate look never seen, and a live
// event arriving before the replay could become its baseline, the
// replayed versions then skipped as stale. With AllAggregates, every
// aggregate of the type the consumer has a row for or the outbox retains
// is so marked. A deadlock with a consumer's batch is retried.
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
		if r.AllAggregates {
			// Conflicts with every consumer's upsert of its version:
			// their in-flight transactions finish first, the next wait.
			// So the statements below see every row the consumer will
			// ever have written before the reset.
			if _, err := tx.Exec(ctx, `LOCK TABLE consumer_aggregate_versions IN SHARE ROW EXCLUSIVE MODE`); err != nil {
				return fmt.Errorf("lock consumer versions: %w", err)
			}
		}
		aggregate, outboxAggregate := `aggregate_id = ANY($3::text[])`, `o.aggregate_id = ANY($3::text[])`
		chosen := `SELECT id FROM unnest($3::text[]) AS id`
		args := []any{r.Consumer, r.AggregateType, ids}
		if r.AllAggregates {
			aggregate, outboxAggregate, args = `true`, `true`, args[:2]
			chosen = `SELECT aggregate_id FROM consumer_aggregate_versions WHERE consumer = $1 AND aggregate_type = $2
				UNION SELECT aggregate_id FROM retained`
		}
		// The mark goes first: the upsert locks the aggregates' rows (in
		// id order, one lock order for every reset) against the consumer
		// for the rest of the transaction. retained is read for the
		// report only: the aggregates whose oldest retained version is not
		// 1 cannot be rebuilt by a replay. Every retained row, published
		// or not, through outbox_aggregate_version_idx (it has them all).
		err := tx.QueryRow(ctx, `
			WITH retained AS (
				SELECT o.aggregate_id, min(o.aggregate_version) AS first_version FROM outbox o
				WHERE o.aggregate_type = $2 AND `+outboxAggregate+`
				GROUP BY o.aggregate_id
			), marked AS (
				INSERT INTO consumer_aggregate_versions AS c (consumer, aggregate_type, aggregate_id, version, reset_at)
				SELECT $1, $2, id, 0, now() FROM (`+chosen+`) AS chosen (id) ORDER BY id
				ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
				SET prev_version = c.version, version = 0, reset_at = now(), updated_at = now()
				RETURNING aggregate_id, prev_version
			), judged AS (
				SELECT m.aggregate_id, m.prev_version > 0 AS forgot,
				       coalesce(r.first_version > 1, m.prev_version > 0) AS purged
				FROM marked m LEFT JOIN retained r USING (aggregate_id)
			)
			SELECT count(*) FILTER (WHERE forgot), count(*) FILTER (WHERE purged),
			       (array_agg(aggregate_id ORDER BY aggregate_id) FILTER (WHERE purged))[1:`+strconv.Itoa(purgedSample)+`]
			FROM judged`, args...).Scan(&res.Versions, &res.Purged, &res.PurgedIDs)
		if err != nil {
			return fmt.Errorf("mark the aggregates reset: %w", err)
		}
		b := &pgx.Batch{}
		b.Queue(`DELETE FROM processed_messages p WHERE p.consumer = $1 AND p.message_id IN (
				SELECT o.message_id FROM outbox o WHERE o.aggregate_type = $2 AND `+outboxAggregate+`)`, args...).Exec(
			func(ct pgconn.CommandTag) error { res.Processed = ct.RowsAffected(); return nil })
		b.Queue(`DELETE FROM dead_letters WHERE consumer = $1 AND aggregate_type = $2 AND `+aggregate+`
			AND status IN ('retrying', 'dead', 'held')`, args...).Exec(
			func(ct pgconn.CommandTag) error { res.DeadLetters = ct.RowsAffected(); return nil })
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
