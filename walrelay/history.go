package walrelay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
)

// historyChunk bounds one INSERT of history rows.
const historyChunk = 5000

// insertHistorySQL appends one row per element of its arrays.
const insertHistorySQL = `
			INSERT INTO outbox_wal_history (commit_lsn, position, message_id, topic, aggregate_type, aggregate_id, aggregate_version,
			    event_type, payload, metadata, occurred_at)
			SELECT l::pg_lsn, pos, m::uuid, t, at, ai, v, et, p::json, md::jsonb, oc
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[],
			            $9::text[], $10::timestamptz[], $11::int[]) AS x(l, m, t, at, ai, v, et, p, md, oc, pos)`

// writeHistory appends its to outbox_wal_history, in the partition of
// today (UTC), which it creates when missing. With the broker audit on it
// returns each row's id by (commit LSN, position), which the receipts
// name; nil without it.
func (r *Relay) writeHistory(ctx context.Context, txns []txn, its []item) (map[eventKey]int64, error) {
	if len(its) == 0 {
		return nil, nil
	}
	if err := r.ensurePartitions(ctx, time.Now()); err != nil {
		return nil, err
	}
	var ids map[eventKey]int64 // the history rows' ids, for the audit's receipts only
	if r.auditor != nil {
		ids = make(map[eventKey]int64, len(its))
	}
	for start := 0; start < len(its); start += historyChunk {
		chunk := its[start:min(start+historyChunk, len(its))]
		n := len(chunk)
		lsns, mids, topics, atypes, aids, etypes, payloads, mds := make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		versions := make([]int64, n)
		positions := make([]int32, n)
		occurred := make([]time.Time, n)
		for i, it := range chunk {
			md := []byte("{}")
			if len(it.ev.Metadata) > 0 {
				var err error
				if md, err = json.Marshal(it.ev.Metadata); err != nil {
					return nil, fmt.Errorf("metadata of %s: %w", it.ev.MessageID, err)
				}
			}
			lsns[i], mids[i], topics[i], atypes[i], aids[i], etypes[i] = txns[it.txn].commitLSN.String(), it.ev.MessageID,
				it.ev.Topic, it.ev.AggregateType, it.ev.AggregateID, it.ev.EventType
			positions[i] = int32(it.pos)
			payloads[i], mds[i], versions[i], occurred[i] = string(it.ev.Payload), string(md), it.ev.AggregateVersion, it.ev.OccurredAt
		}
		args := []any{lsns, mids, topics, atypes, aids, versions, etypes, payloads, mds, occurred, positions}
		if r.auditor == nil {
			// No receipts to key by history row: nothing to read back.
			if _, err := r.cfg.Pool.Exec(ctx, insertHistorySQL, args...); err != nil {
				return nil, fmt.Errorf("insert history: %w", err)
			}
			continue
		}
		rows, err := r.cfg.Pool.Query(ctx, insertHistorySQL+` RETURNING commit_lsn::text, position, id`, args...)
		if err != nil {
			return nil, fmt.Errorf("insert history: %w", err)
		}
		if err := collectHistoryIDs(rows, ids); err != nil {
			return nil, fmt.Errorf("insert history: %w", err)
		}
	}
	return ids, nil
}

// collectHistoryIDs adds rows of (commit_lsn text, position, id) to ids.
func collectHistoryIDs(rows pgx.Rows, ids map[eventKey]int64) error {
	var (
		k  eventKey
		id int64
	)
	_, err := pgx.ForEachRow(rows, []any{&k.commitLSN, &k.position, &id}, func() error {
		ids[k] = id
		return nil
	})
	return err
}

// eventKey is an event's place in the WAL: its transaction's commit LSN
// (text) and its position in the transaction, as the history keeps them.
type eventKey struct {
	commitLSN string
	position  int32
}

// partitionName is the history partition of day (UTC).
func partitionName(day time.Time) string {
	return "outbox_wal_history_" + day.UTC().Format("20060102")
}

// ensurePartitions creates today's and tomorrow's partitions when missing,
// so that a write just after midnight finds its own.
func (r *Relay) ensurePartitions(ctx context.Context, now time.Time) error {
	for _, d := range []time.Time{now.UTC(), now.UTC().Add(24 * time.Hour)} {
		day := time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
		name := partitionName(day)
		if r.partitions[name] {
			continue
		}
		_, err := r.cfg.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF outbox_wal_history FOR VALUES FROM ('%s') TO ('%s')`,
			pgx.Identifier{name}.Sanitize(), day.Format(time.RFC3339), day.Add(24*time.Hour).Format(time.RFC3339)))
		if err != nil {
			return fmt.Errorf("create history partition %s: %w", name, err)
		}
		r.partitions[name] = true
	}
	return nil
}

// pruneHistory drops the partitions whose day ended more than
// HistoryRetention ago: whole, no delete, no vacuum.
func (r *Relay) pruneHistory(ctx context.Context, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'outbox_wal_history'::regclass`)
	if err != nil {
		r.cfg.Logger.Warn("wal relay: list history partitions", "error", err.Error())
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		r.cfg.Logger.Warn("wal relay: list history partitions", "error", err.Error())
		return
	}
	cutoff := time.Now().Add(-r.cfg.HistoryRetention)
	for _, n := range names {
		day, err := time.Parse("20060102", strings.TrimPrefix(n, "outbox_wal_history_"))
		if err != nil || !day.Add(24*time.Hour).Before(cutoff) {
			continue
		}
		if _, err := conn.Exec(ctx, `DROP TABLE `+pgx.Identifier{n}.Sanitize()); err != nil {
			r.cfg.Logger.Warn("wal relay: drop history partition", "partition", n, "error", err.Error())
			continue
		}
		delete(r.partitions, n)
		r.cfg.Logger.Info("wal relay: history partition dropped past retention", "partition", n)
	}
	// Receipts the audit has not settled by now (a consumer group stopped
	// for the retention) point to history that is gone: nothing could be
	// repaired from them.
	if _, err := conn.Exec(ctx, `DELETE FROM outbox_wal_receipts WHERE published_at < $1`, cutoff); err != nil {
		r.cfg.Logger.Warn("wal relay: purge receipts past retention", "error", err.Error())
	}
}

// HistoryFilter chooses the events [ReplayHistory] publishes again. The
// zero value is every event the history holds.
type HistoryFilter struct {
	// Since and Until bound when the relay read the events (recorded_at);
	// zero is unbounded.
	Since, Until time.Time
	// Topic, AggregateType and AggregateID, when set, must match.
	Topic, AggregateType, AggregateID string
}

// ReplayHistory publishes again, through b, the events of
// outbox_wal_history that f chooses, in commit order, each once (the
// history may hold an event twice: read again after a relay was killed),
// in the forwarder's waves. It is the WAL mode's replay: consumers
// deduplicate what they had already. It returns how many events the
// broker acknowledged; the first refused or unavailable one stops it
// with an error, its aggregate's later events not sent.
func ReplayHistory(ctx context.Context, db Querier, b forwarder.Broker, f HistoryFilter) (int, error) {
	const page = 5000
	seen := make(map[string]bool)
	sent := 0
	afterLSN, afterPos := "0/0", 0
	for {
		rows, err := db.Query(ctx, `
			SELECT commit_lsn::text, position, message_id::text, topic, aggregate_type, aggregate_id, aggregate_version,
			       event_type, payload::text, metadata::text, occurred_at
			FROM outbox_wal_history
			WHERE (commit_lsn, position) > ($1::pg_lsn, $2)
			  AND ($3::timestamptz IS NULL OR recorded_at >= $3) AND ($4::timestamptz IS NULL OR recorded_at < $4)
			  AND ($5 = '' OR topic = $5) AND ($6 = '' OR aggregate_type = $6) AND ($7 = '' OR aggregate_id = $7)
			ORDER BY commit_lsn, position
			LIMIT $8`, afterLSN, afterPos, nullTime(f.Since), nullTime(f.Until), f.Topic, f.AggregateType, f.AggregateID, page)
		if err != nil {
			return sent, fmt.Errorf("read history: %w", err)
		}
		type hrow struct {
			lsn   string
			pos   int
			topic string
			row   forwarder.Row
		}
		hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (hrow, error) {
			var h hrow
			err := r.Scan(&h.lsn, &h.pos, &h.row.MessageID, &h.topic, &h.row.AggregateType, &h.row.AggregateID,
				&h.row.AggregateVersion, &h.row.EventType, &h.row.Payload, &h.row.Metadata, &h.row.OccurredAt)
			return h, err
		})
		if err != nil {
			return sent, fmt.Errorf("read history: %w", err)
		}
		if len(hs) == 0 {
			return sent, nil
		}
		afterLSN, afterPos = hs[len(hs)-1].lsn, hs[len(hs)-1].pos
		var keys []string
		var msgs []forwarder.Outgoing
		for _, h := range hs {
			if seen[h.row.MessageID] {
				continue
			}
			seen[h.row.MessageID] = true
			msg, err := forwarder.Message(h.row)
			if err != nil {
				return sent, fmt.Errorf("history event %s: %w", h.row.MessageID, err)
			}
			keys = append(keys, h.row.AggregateType+"\x00"+h.row.AggregateID)
			msgs = append(msgs, forwarder.Outgoing{Topic: h.topic, AggregateID: h.row.AggregateID, Message: msg})
		}
		results := make([]error, len(msgs))
		forwarder.PublishWaves(ctx, b, keys, msgs, results)
		for i, err := range results {
			if err != nil {
				return sent, fmt.Errorf("replay %s: %w", msgs[i].Message.UUID, err)
			}
			sent++
		}
		if len(hs) < page {
			return sent, nil
		}
	}
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
