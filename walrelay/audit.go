package walrelay

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/advisory"
)

// historyAuditStore is the WAL mode's [forwarder.AuditStore]: receipts of
// history rows in outbox_wal_receipts, states in outbox_wal_audit, and a
// lost event put back by copying its history row into outbox_wal_parked,
// due at once with no attempt counted (a broker's loss is not the event's
// failure), its discard marker instead when it was discarded. The parked
// table holds its aggregate's later events behind it, and the reader's
// retry rounds publish each aggregate's parked events in commit order
// (commit_lsn, position), whenever each was parked: a repaired event goes
// before its aggregate's later events parked since.
var historyAuditStore = forwarder.AuditStore{
	Lock:     advisory.WALAudit,
	Receipts: "outbox_wal_receipts",
	IDs:      "history_ids",
	States:   "outbox_wal_audit",
	Messages: `SELECT id, message_id::text, topic FROM outbox_wal_history WHERE id = ANY($1)`,
	Repair: `
		WITH put AS (
			INSERT INTO outbox_wal_parked (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type,
			    payload, metadata, occurred_at, commit_lsn, position, discarded_at, next_attempt_at)
			SELECT message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type,
			       payload, metadata, occurred_at, commit_lsn, position, discarded_at, now()
			FROM outbox_wal_history WHERE id = ANY($1)
			ORDER BY commit_lsn, position
			ON CONFLICT (message_id) DO NOTHING
			RETURNING 1)
		SELECT (SELECT count(*) FROM put), (SELECT count(*) FROM outbox_wal_history WHERE id = ANY($1))`,
}

// Audit checks, once, the receipts of what the broker acknowledged against
// the broker, forgets what every consumer had, and puts back what the
// broker lost, to be published again from the history (see
// [forwarder.RunAudit]: one rule for both modes). The reading relay calls
// it every Config.AuditInterval; it is exported for tests and tools. It
// does nothing when the audit is off (the Broker is no
// [forwarder.Auditor], AuditInterval is negative, or no history is kept).
func (r *Relay) Audit(ctx context.Context) error {
	if r.auditor == nil {
		return nil
	}
	repairs, err := forwarder.RunAudit(ctx, r.cfg.Pool, r.auditor, historyAuditStore, r.cfg.ShutdownTimeout, r.cfg.Logger)
	forwarder.LogRepairs(r.cfg.Logger, repairs)
	for _, rp := range repairs {
		r.metrics.brokerLosses.WithLabelValues(rp.Topic).Inc()
		r.metrics.repaired.WithLabelValues(rp.Topic).Add(float64(rp.Repaired))
		if rp.Repaired > 0 {
			// The retry round publishes them now, not at its next tick.
			r.retryNow.Store(true)
		}
	}
	return err
}

// saveReceipts writes the receipts of the events the broker acknowledged
// (results[i] nil), keyed by their history rows: those this batch wrote
// (ids), or, for events whose history an earlier read of the same
// transactions wrote, found by their place in the WAL.
func (r *Relay) saveReceipts(ctx context.Context, conn *pgx.Conn, txns []txn, items []item, results []error,
	receipts []forwarder.Receipt, ids map[eventKey]int64) error {
	var (
		acked      []int // items the broker took
		keys       []eventKey
		lsns, mids []string
		poss       []int32
	)
	for i, it := range items {
		if results[i] != nil {
			continue
		}
		k := eventKey{commitLSN: txns[it.txn].commitLSN.String(), position: int32(it.pos)}
		acked, keys = append(acked, i), append(keys, k)
		if _, ok := ids[k]; !ok {
			lsns, poss, mids = append(lsns, k.commitLSN), append(poss, k.position), append(mids, it.ev.MessageID)
		}
	}
	if len(acked) == 0 {
		return nil
	}
	if len(lsns) > 0 {
		// By message id too: after a failover to a standby that was
		// behind, a commit LSN may name another transaction.
		rows, err := conn.Query(ctx, `
			SELECT h.commit_lsn::text, h.position, max(h.id) FROM outbox_wal_history h
			JOIN unnest($1::pg_lsn[], $2::int[], $3::uuid[]) AS k(l, p, m) ON h.commit_lsn = k.l AND h.position = k.p AND h.message_id = k.m
			WHERE h.id IS NOT NULL GROUP BY 1, 2`, lsns, poss, mids)
		if err != nil {
			return fmt.Errorf("find the history rows of the receipts: %w", err)
		}
		if ids == nil {
			ids = make(map[eventKey]int64, len(lsns))
		}
		if err := collectHistoryIDs(rows, ids); err != nil {
			return fmt.Errorf("find the history rows of the receipts: %w", err)
		}
	}
	var (
		hist              []int64
		topics, positions []string
	)
	for j, i := range acked {
		id, ok := ids[keys[j]]
		if !ok {
			// No history row to repair it from (written before the
			// history had ids): nothing an audit could do about it.
			continue
		}
		hist = append(hist, id)
		topics = append(topics, receipts[i].BrokerTopic)
		positions = append(positions, receipts[i].Position)
	}
	b := &pgx.Batch{}
	historyAuditStore.QueueReceipts(b, hist, topics, positions)
	if b.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write receipts: %w", err)
	}
	return nil
}
