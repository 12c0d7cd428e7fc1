package walrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/backoff"
)

// parkRow is an event copied into outbox_wal_parked: refused (attempts 1,
// its error, a retry due) or held behind its aggregate's refused event.
type parkRow struct {
	item
	commitLSN     lsn
	attempts      int
	lastError     *string
	nextAttemptAt *time.Time
	parkedAt      *time.Time
}

func (r *Relay) retryDelay(attempt int) time.Duration {
	return backoff.Delay(r.cfg.RetryBackoff, r.cfg.RetryBackoffMax, attempt)
}

// heldAggregates are the aggregates with events in outbox_wal_parked: their
// new events queue behind them.
func heldAggregates(ctx context.Context, conn *pgx.Conn) (map[string]bool, error) {
	rows, err := conn.Query(ctx, `SELECT DISTINCT aggregate_type, aggregate_id FROM outbox_wal_parked`)
	if err != nil {
		return nil, fmt.Errorf("read parked aggregates: %w", err)
	}
	held := make(map[string]bool)
	var typ, id string
	_, err = pgx.ForEachRow(rows, []any{&typ, &id}, func() error {
		held[typ+"\x00"+id] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read parked aggregates: %w", err)
	}
	return held, nil
}

// insertParked copies ps into outbox_wal_parked in their order (the ids
// keep each aggregate's order). An event already there (read again after
// a crash) is left as it is.
func insertParked(ctx context.Context, conn *pgx.Conn, ps []parkRow) error {
	if len(ps) == 0 {
		return nil
	}
	n := len(ps)
	var (
		ids, topics, atypes, aids, etypes, payloads, mds, lsns = make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		versions  []int64      = make([]int64, n)
		occurred  []time.Time  = make([]time.Time, n)
		attempts  []int32      = make([]int32, n)
		lastErrs  []*string    = make([]*string, n)
		dues      []*time.Time = make([]*time.Time, n)
		parked    []*time.Time = make([]*time.Time, n)
		positions              = make([]int32, n)
	)
	for i, p := range ps {
		md, err := json.Marshal(p.ev.Metadata)
		if err != nil {
			return fmt.Errorf("park: metadata of %s: %w", p.ev.MessageID, err)
		}
		if p.ev.Metadata == nil {
			md = []byte("{}")
		}
		ids[i], topics[i], atypes[i], aids[i], etypes[i] = p.ev.MessageID, p.ev.Topic, p.ev.AggregateType, p.ev.AggregateID, p.ev.EventType
		payloads[i], mds[i], lsns[i] = string(p.ev.Payload), string(md), p.commitLSN.String()
		versions[i], occurred[i], attempts[i] = p.ev.AggregateVersion, p.ev.OccurredAt, int32(p.attempts)
		lastErrs[i], dues[i], parked[i] = p.lastError, p.nextAttemptAt, p.parkedAt
		positions[i] = int32(p.pos)
	}
	_, err := conn.Exec(ctx, `
		INSERT INTO outbox_wal_parked (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type,
		    payload, metadata, occurred_at, commit_lsn, position, attempts, last_error, next_attempt_at, parked_at)
		SELECT m::uuid, t, at, ai, v, et, p::json, md::jsonb, oc, l::pg_lsn, pos, a, le, na, pa
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[],
		            $9::timestamptz[], $10::text[], $11::int[], $12::text[], $13::timestamptz[], $14::timestamptz[], $15::int[])
		     WITH ORDINALITY AS x(m, t, at, ai, v, et, p, md, oc, l, a, le, na, pa, pos, ord)
		ORDER BY ord
		ON CONFLICT (message_id) DO NOTHING`,
		ids, topics, atypes, aids, versions, etypes, payloads, mds, occurred, lsns, attempts, lastErrs, dues, parked, positions)
	if err != nil {
		return fmt.Errorf("park refused events: %w", err)
	}
	return nil
}

// retryParked publishes the head of each parked aggregate whose retry is
// due (or that an operator discarded: its marker), and goes on with the
// aggregate's next event while the broker takes them, at most maxRounds
// times per call. A refusal counts an attempt and schedules the next on
// the forwarder's backoff; at MaxAttempts the event is parked for an
// operator. An outage costs nothing.
func (r *Relay) retryParked(ctx context.Context, conn *pgx.Conn) error {
	const maxRounds = 100
	for range maxRounds {
		progressed, err := r.retryRound(ctx, conn)
		if err != nil || !progressed {
			return err
		}
	}
	return nil
}

type parkedHead struct {
	id       int64
	row      forwarder.Row
	topic    string
	attempts int
}

func (r *Relay) retryRound(ctx context.Context, conn *pgx.Conn) (bool, error) {
	rows, err := conn.Query(ctx, `
		SELECT id, message_id::text, topic, aggregate_type, aggregate_id, aggregate_version, event_type,
		       payload::text, metadata::text, occurred_at, attempts, discarded_at
		FROM (SELECT DISTINCT ON (aggregate_type, aggregate_id) * FROM outbox_wal_parked
		      ORDER BY aggregate_type, aggregate_id, commit_lsn, position, id) head
		WHERE parked_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= now())
		ORDER BY id LIMIT 1000`)
	if err != nil {
		return false, fmt.Errorf("read parked events: %w", err)
	}
	heads, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (parkedHead, error) {
		var h parkedHead
		err := row.Scan(&h.id, &h.row.MessageID, &h.topic, &h.row.AggregateType, &h.row.AggregateID, &h.row.AggregateVersion,
			&h.row.EventType, &h.row.Payload, &h.row.Metadata, &h.row.OccurredAt, &h.attempts, &h.row.DiscardedAt)
		return h, err
	})
	if err != nil {
		return false, fmt.Errorf("read parked events: %w", err)
	}
	if len(heads) == 0 {
		return false, nil
	}
	keys := make([]string, len(heads))
	msgs := make([]forwarder.Outgoing, len(heads))
	results := make([]error, len(heads))
	for i, h := range heads {
		keys[i] = h.row.AggregateType + "\x00" + h.row.AggregateID
		msg, err := forwarder.Message(h.row)
		if err != nil {
			results[i] = err
			continue
		}
		msgs[i] = forwarder.Outgoing{Topic: h.topic, AggregateID: h.row.AggregateID, Message: msg}
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	receipts := r.publishWaves(pctx, keys, msgs, results)

	var done, failedIDs []int64
	// The receipts of what went out, by parked row; markers: the discarded
	// events whose marker went out instead.
	var receiptOf, markers []int64
	var receiptTopics, receiptPositions []string
	var failedErr []string
	var failedDue []time.Time
	var parkNow []bool
	now := time.Now()
	var outage error
	for i, h := range heads {
		err := results[i]
		switch {
		case err == nil:
			done = append(done, h.id)
			r.metrics.published.WithLabelValues(h.topic).Inc()
			if receipts != nil {
				receiptOf = append(receiptOf, h.id)
				receiptTopics = append(receiptTopics, receipts[i].BrokerTopic)
				receiptPositions = append(receiptPositions, receipts[i].Position)
				if h.row.DiscardedAt != nil {
					markers = append(markers, h.id)
				}
			}
		case errors.Is(err, forwarder.ErrBrokerUnavailable):
			outage = err
		default:
			attempt := h.attempts + 1
			park := attempt >= r.cfg.MaxAttempts
			failedIDs = append(failedIDs, h.id)
			failedErr = append(failedErr, truncate(err.Error(), 2000))
			failedDue = append(failedDue, now.Add(r.retryDelay(attempt)))
			parkNow = append(parkNow, park)
			r.metrics.failedAttempts.WithLabelValues(h.topic).Inc()
			if park {
				r.metrics.parked.WithLabelValues(h.topic).Inc()
				r.cfg.Logger.Warn("wal relay: event parked", "message_id", h.row.MessageID,
					"aggregate_type", h.row.AggregateType, "aggregate_id", h.row.AggregateID, "attempts", attempt, "error", err.Error())
			}
		}
	}
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ShutdownTimeout)
	defer mcancel()
	b := &pgx.Batch{}
	if len(markers) > 0 {
		// A repair of a lost marker publishes the marker again, not the
		// event: the history row says it was discarded.
		b.Queue(`
			UPDATE outbox_wal_history x SET discarded_at = w.discarded_at
			FROM outbox_wal_parked w
			WHERE w.id = ANY($1) AND x.commit_lsn = w.commit_lsn AND x.message_id = w.message_id`, markers)
	}
	if len(receiptOf) > 0 {
		// Keyed by the events' history rows, found by their transaction
		// and message id; before their parked rows go.
		b.Queue(`
			INSERT INTO outbox_wal_receipts (history_ids, broker_topics, positions)
			SELECT array_agg(h.id ORDER BY k.ord), array_agg(k.t ORDER BY k.ord), array_agg(k.p ORDER BY k.ord)
			FROM unnest($1::bigint[], $2::text[], $3::text[]) WITH ORDINALITY AS k(pid, t, p, ord)
			JOIN outbox_wal_parked w ON w.id = k.pid
			JOIN LATERAL (SELECT max(x.id) AS id FROM outbox_wal_history x
			              WHERE x.commit_lsn = w.commit_lsn AND x.message_id = w.message_id AND x.id IS NOT NULL) h ON h.id IS NOT NULL
			HAVING count(*) > 0`, receiptOf, receiptTopics, receiptPositions)
	}
	if len(done) > 0 {
		b.Queue(`DELETE FROM outbox_wal_parked WHERE id = ANY($1)`, done)
	}
	if len(failedIDs) > 0 {
		b.Queue(`
			UPDATE outbox_wal_parked o SET attempts = o.attempts + 1, last_error = f.err,
			       next_attempt_at = f.due, parked_at = CASE WHEN f.park THEN now() END
			FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::bool[]) AS f(id, err, due, park)
			WHERE o.id = f.id`, failedIDs, failedErr, failedDue, parkNow)
	}
	if b.Len() > 0 {
		if err := conn.SendBatch(mctx, b).Close(); err != nil {
			return false, fmt.Errorf("mark parked events: %w", err)
		}
	}
	if outage != nil && len(done) == 0 {
		return false, outage
	}
	return len(done) > 0, nil
}

// ParkedFilter chooses parked events for [RetryParked] and
// [DiscardParked]: one by its id in outbox_wal_parked, or all of a topic,
// or all (zero value).
type ParkedFilter struct {
	ID    int64
	Topic string
}

// RetryParked makes the events parked after MaxAttempts that f chooses due
// again, with their attempts reset, as forwarder.RetryParked does in table
// mode; the relay retries them within a tick. It returns how many.
func RetryParked(ctx context.Context, db Querier, f ParkedFilter) (int64, error) {
	return releaseParked(ctx, db, f, false)
}

// DiscardParked gives up on the parked events f chooses: the relay
// publishes each one's discard marker (forwarder.Message of a discarded
// row) in its place, so that consumers go on with the aggregate's later
// events, as in table mode. It returns how many.
func DiscardParked(ctx context.Context, db Querier, f ParkedFilter) (int64, error) {
	return releaseParked(ctx, db, f, true)
}

func releaseParked(ctx context.Context, db Querier, f ParkedFilter, discard bool) (int64, error) {
	tag, err := db.Exec(ctx, `
		UPDATE outbox_wal_parked SET parked_at = NULL, attempts = 0, next_attempt_at = NULL,
		       discarded_at = CASE WHEN $3 THEN now() ELSE discarded_at END
		WHERE parked_at IS NOT NULL AND ($1 = 0 OR id = $1) AND ($2 = '' OR topic = $2)`, f.ID, f.Topic, discard)
	if err != nil {
		return 0, fmt.Errorf("release parked events: %w", err)
	}
	return tag.RowsAffected(), nil
}
