package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/forwarder"
)

// DefaultBatchSize is how many rows one page of [Select] reads and one
// Publish call of [Publish] sends.
const DefaultBatchSize = 500

// Row is one selected outbox row.
type Row struct {
	// ID is the outbox id: rows come in id order. From SourceWALHistory,
	// which has no ids, the event's rank in the replay (1, 2, ...), the
	// events coming in commit order.
	ID int64
	// Topic is the row's outbox topic.
	Topic string
	forwarder.Row
}

// Count returns how many rows f chooses.
func Count(ctx context.Context, pool *pgxpool.Pool, f Filter) (int64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	where, args := f.where(1)
	q := `SELECT count(*) FROM outbox o WHERE ` + where
	if f.walHistory() {
		q = `SELECT count(DISTINCT o.message_id) FROM outbox_wal_history o WHERE ` + where
	}
	var n int64
	if err := pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("replay: count outbox rows: %w", err)
	}
	return n, nil
}

// Select calls fn with the rows f chooses, in id order, batchSize at a
// time (0: DefaultBatchSize). Each batch is its own query, keyed on the
// last id seen: no transaction stays open while fn works, and rows the
// purge deletes meanwhile are simply not seen. An error of fn stops it and
// is returned.
func Select(ctx context.Context, pool *pgxpool.Pool, f Filter, batchSize int, fn func([]Row) error) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if batchSize <= 0 {
		batchSize = DefaultBatchSize
	}
	if f.walHistory() {
		return selectHistory(ctx, pool, f, batchSize, fn)
	}
	where, args := f.where(3)
	q := `SELECT o.id, o.topic, o.message_id::text, o.aggregate_type, o.aggregate_id, o.aggregate_version,
	       o.event_type, o.payload::text, o.metadata::text, o.occurred_at, o.discarded_at
	FROM outbox o WHERE o.id > $1 AND ` + where + ` ORDER BY o.id LIMIT $2`
	var after int64
	for {
		rows, err := pool.Query(ctx, q, append([]any{after, batchSize}, args...)...)
		if err != nil {
			return fmt.Errorf("replay: select outbox rows: %w", err)
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
			var x Row
			err := r.Scan(&x.ID, &x.Topic, &x.MessageID, &x.AggregateType, &x.AggregateID, &x.AggregateVersion,
				&x.EventType, &x.Payload, &x.Metadata, &x.OccurredAt, &x.DiscardedAt)
			return x, err
		})
		if err != nil {
			return fmt.Errorf("replay: select outbox rows: %w", err)
		}
		if len(batch) == 0 {
			return nil
		}
		if err := fn(batch); err != nil {
			return err
		}
		if len(batch) < batchSize {
			return nil
		}
		after = batch[len(batch)-1].ID
	}
}

// ErrPublish wraps a broker's refusal of a replayed message.
var ErrPublish = errors.New("replay: publish")

// Options tune [Publish].
type Options struct {
	// BatchSize is how many rows one Publish call to the broker sends.
	// Defaults to DefaultBatchSize.
	BatchSize int
}

// Publish replays the rows f chooses to the consumer named consumerName:
// each row's message, built as the forwarder builds it (for a row an
// operator discarded, its discard marker, never the discarded payload),
// published through
// broker (a brokers.Backend's Broker(), of the backend the consumer reads)
// to consumer.ReplayTopic(consumerName) keyed consumer.ReplayKey, in id
// order, one Publish call per batch. It returns how many messages the
// broker acknowledged. It stops at the first message the broker refuses
// (an error wrapping ErrPublish, and forwarder.ErrBrokerUnavailable when it
// is the broker's state): running the same replay again is safe, the
// consumer skips what it already handled. Set f.Topic to the consumer's
// topic: a consumer is not meant to receive another topic's events.
func Publish(ctx context.Context, pool *pgxpool.Pool, broker forwarder.Broker, consumerName string, f Filter, opts Options) (int64, error) {
	if consumerName == "" {
		return 0, errors.New("replay: the consumer name is required")
	}
	if broker == nil {
		return 0, errors.New("replay: the broker is required")
	}
	topic := consumer.ReplayTopic(consumerName)
	var published int64
	err := Select(ctx, pool, f, opts.BatchSize, func(rows []Row) error {
		msgs := make([]forwarder.Outgoing, len(rows))
		for i, r := range rows {
			msg, err := forwarder.Message(r.Row)
			if err != nil {
				return fmt.Errorf("replay: outbox row %d: %w", r.ID, err)
			}
			msgs[i] = forwarder.Outgoing{Topic: topic, AggregateID: consumer.ReplayKey, Message: msg}
		}
		errs := broker.Publish(ctx, msgs)
		for i, err := range errs {
			if err != nil {
				return fmt.Errorf("%w: outbox row %d (message %s) to %s: %w", ErrPublish, rows[i].ID, rows[i].MessageID, topic, err)
			}
			published++
		}
		if len(errs) != len(msgs) {
			return fmt.Errorf("%w: the broker returned %d results for %d messages", ErrPublish, len(errs), len(msgs))
		}
		return nil
	})
	return published, err
}

// selectHistory is Select from outbox_wal_history: in commit order
// (commit_lsn, position), each event once (the history holds an event
// twice when a relay was killed before it confirmed its slot).
func selectHistory(ctx context.Context, pool *pgxpool.Pool, f Filter, batchSize int, fn func([]Row) error) error {
	where, args := f.where(4)
	q := `SELECT o.commit_lsn::text, o.position, o.topic, o.message_id::text, o.aggregate_type, o.aggregate_id,
	       o.aggregate_version, o.event_type, o.payload::text, o.metadata::text, o.occurred_at
	FROM outbox_wal_history o WHERE (o.commit_lsn, o.position) > ($1::pg_lsn, $2) AND ` + where + `
	ORDER BY o.commit_lsn, o.position LIMIT $3`
	afterLSN, afterPos := "0/0", 0
	seen := make(map[string]bool)
	var rank int64
	for {
		var lastLSN string
		var lastPos, read int
		var batch []Row
		rows, err := pool.Query(ctx, q, append([]any{afterLSN, afterPos, batchSize}, args...)...)
		if err != nil {
			return fmt.Errorf("replay: select WAL history: %w", err)
		}
		for rows.Next() {
			var x Row
			if err := rows.Scan(&lastLSN, &lastPos, &x.Topic, &x.MessageID, &x.AggregateType, &x.AggregateID,
				&x.AggregateVersion, &x.EventType, &x.Payload, &x.Metadata, &x.OccurredAt); err != nil {
				rows.Close()
				return fmt.Errorf("replay: select WAL history: %w", err)
			}
			read++
			if seen[x.MessageID] {
				continue
			}
			seen[x.MessageID] = true
			rank++
			x.ID = rank
			batch = append(batch, x)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("replay: select WAL history: %w", err)
		}
		if read == 0 {
			return nil
		}
		if len(batch) > 0 {
			if err := fn(batch); err != nil {
				return err
			}
		}
		if read < batchSize {
			return nil
		}
		afterLSN, afterPos = lastLSN, lastPos
	}
}
