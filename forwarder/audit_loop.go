package forwarder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// auditLock keeps the audit to one instance at a time ("outa"): while
// partition 0 moves, two instances may both believe they hold it.
const auditLock = 0x6f757461

// repairBatch bounds one UPDATE of a repair.
const repairBatch = 1000

// auditLoop runs the broker audit while this instance holds partition 0
// (the instance that exports the outbox gauges), and, on every instance,
// watches for repairs made by whichever instance audits: the rows a repair
// puts back may be in any partition, below any instance's low-water mark.
func (f *Forwarder) auditLoop(ctx context.Context) {
	audit := time.NewTicker(f.cfg.AuditInterval)
	defer audit.Stop()
	// The watch is one small read; at the lease tick's pace a repaired row
	// of another instance's partition waits seconds, not FullClaimInterval.
	watch := time.NewTicker(min(f.cfg.LeaseRenewInterval, f.cfg.AuditInterval))
	defer watch.Stop()
	var seen *time.Time // the newest repair this instance has applied
	f.watchRepairs(ctx, &seen)
	for {
		select {
		case <-ctx.Done():
			return
		case <-watch.C:
			f.watchRepairs(ctx, &seen)
		case <-audit.C:
			if !f.exportsStats() {
				continue
			}
			if err := f.Audit(ctx); err != nil && ctx.Err() == nil {
				f.cfg.Logger.Warn("broker audit", "error", err.Error())
			}
		}
	}
}

// watchRepairs lowers this instance's low-water mark to the first row of
// any repair newer than *seen. The first call only records where the
// repairs stand: a starting instance's mark is 0 anyway.
func (f *Forwarder) watchRepairs(ctx context.Context, seen **time.Time) {
	var (
		latest *time.Time
		from   *int64
	)
	err := f.cfg.Pool.QueryRow(ctx, `
		SELECT max(last_loss_at), min(repair_from_id) FILTER (WHERE last_loss_at > $1)
		FROM outbox_audit`, *seen).Scan(&latest, &from)
	if err != nil {
		if ctx.Err() == nil {
			f.cfg.Logger.Warn("read broker repairs", "error", err.Error())
		}
		return
	}
	first := *seen == nil
	if latest != nil {
		*seen = latest
	} else if first {
		*seen = &time.Time{}
	}
	if !first && from != nil {
		f.low.resetBelow(*from)
		f.Wake()
	}
}

// auditResult is one broker topic's audit, to be recorded.
type auditResult struct {
	topic, brokerTopic string
	next               []byte
	loss               *Loss
	rows               int64
	fromID             int64
}

// Audit audits every broker topic of the topics the outbox has published
// to, once, and repairs what was lost. The audit loop calls it every
// AuditInterval on the holder of partition 0; it is exported for tests and
// tools. It does nothing when the broker is no [Auditor] or the audit is
// off, or while another instance audits. An error of one broker topic
// leaves that topic's state as it was and is reported once all were tried.
func (f *Forwarder) Audit(ctx context.Context) error {
	if f.auditor == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, max(f.cfg.AuditInterval, 30*time.Second))
	defer cancel()
	tx, err := f.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin audit: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var acquired bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema()))`, auditLock).Scan(&acquired); err != nil {
		return fmt.Errorf("audit lock: %w", err)
	}
	if !acquired {
		return nil
	}
	topics, states, err := auditInputs(ctx, tx)
	if err != nil {
		return err
	}

	var (
		results []auditResult
		errs    []error
	)
	for _, topic := range topics {
		for _, bt := range f.auditor.Topics(topic) {
			next, loss, err := f.auditor.Audit(ctx, bt, states[bt])
			if err != nil {
				errs = append(errs, fmt.Errorf("audit %s: %w", bt, err))
				continue
			}
			r := auditResult{topic: topic, brokerTopic: bt, next: next, loss: loss}
			if loss != nil {
				// In the audit's transaction: the new baseline is recorded
				// only with the repair, so a crash in between makes the
				// next audit find the loss again (a duplicate repair, never
				// a forgotten one).
				r.rows, r.fromID, err = f.repair(ctx, tx, topic, bt, loss.Since.Add(-f.cfg.AuditMargin))
				if err != nil {
					return errors.Join(append(errs, err)...)
				}
			}
			results = append(results, r)
		}
	}
	if err := saveAudits(ctx, tx, results); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := tx.Commit(ctx); err != nil {
		return errors.Join(append(errs, fmt.Errorf("commit audit: %w", err))...)
	}

	woke := false
	for _, r := range results {
		if r.loss == nil {
			continue
		}
		f.metrics.brokerLosses.WithLabelValues(r.topic).Inc()
		f.metrics.repaired.WithLabelValues(r.topic).Add(float64(r.rows))
		f.cfg.Logger.Warn("broker lost acknowledged entries: publishing them again",
			"topic", r.topic, "broker_topic", r.brokerTopic, "reason", r.loss.Reason,
			"since", r.loss.Since.UTC().Format(time.RFC3339Nano), "margin", f.cfg.AuditMargin, "rows", r.rows)
		if r.rows > 0 {
			f.low.resetBelow(r.fromID)
			woke = true
		}
	}
	if woke {
		f.Wake()
	}
	return errors.Join(errs...)
}

func auditInputs(ctx context.Context, tx pgx.Tx) ([]string, map[string][]byte, error) {
	rows, err := tx.Query(ctx, `SELECT topic FROM outbox_audit_topics ORDER BY topic`)
	if err != nil {
		return nil, nil, fmt.Errorf("read audited topics (has `outflow migrate up` run?): %w", err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("read audited topics: %w", err)
	}
	states := map[string][]byte{}
	rows, err = tx.Query(ctx, `SELECT broker_topic, state FROM outbox_audit`)
	if err != nil {
		return nil, nil, fmt.Errorf("read audit states: %w", err)
	}
	var (
		bt    string
		state []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&bt, &state}, func() error {
		states[bt] = slices.Clone(state)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read audit states: %w", err)
	}
	return topics, states, nil
}

func saveAudits(ctx context.Context, tx pgx.Tx, results []auditResult) error {
	b := &pgx.Batch{}
	for _, r := range results {
		if r.loss == nil {
			b.Queue(`
				INSERT INTO outbox_audit (broker_topic, topic, state) VALUES ($1, $2, $3)
				ON CONFLICT (broker_topic) DO UPDATE SET topic = excluded.topic, state = excluded.state, audited_at = now()`,
				r.brokerTopic, r.topic, r.next)
			continue
		}
		var from *int64
		if r.rows > 0 {
			from = &r.fromID
		}
		b.Queue(`
			INSERT INTO outbox_audit (broker_topic, topic, state, last_loss_at, last_loss_reason, last_loss_since, last_repaired, repair_from_id)
			VALUES ($1, $2, $3, now(), $4, $5, $6, $7)
			ON CONFLICT (broker_topic) DO UPDATE SET topic = excluded.topic, state = excluded.state, audited_at = now(),
				last_loss_at = now(), last_loss_reason = excluded.last_loss_reason, last_loss_since = excluded.last_loss_since,
				last_repaired = excluded.last_repaired, repair_from_id = excluded.repair_from_id`,
			r.brokerTopic, r.topic, r.next, r.loss.Reason, r.loss.Since, r.rows, from)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("save audit states: %w", err)
	}
	return nil
}

// repair puts back every row of brokerTopic published at or after since:
// published_at and next_attempt_at to NULL, so that the rows are pending
// again, in the pending-rows index, and are claimed through the normal
// path in id order (the claim holds an aggregate's later rows behind an
// earlier row waiting for a retry, so a due next_attempt_at would let
// through one row per aggregate per claim). attempts is kept: it counts
// the row's own failures, and a broker's loss is none. It returns how many
// rows it put back and the smallest id among them.
//
// There is no index on published_at, on purpose: one would make every
// mark of a published row a non-HOT update. A loss is rare, so the repair
// scans the topic's retained rows, and keeps those of brokerTopic.
func (f *Forwarder) repair(ctx context.Context, tx pgx.Tx, topic, brokerTopic string, since time.Time) (n, fromID int64, err error) {
	rows, err := tx.Query(ctx, `SELECT id, aggregate_id FROM outbox WHERE topic = $1 AND published_at >= $2 ORDER BY id`, topic, since)
	if err != nil {
		return 0, 0, fmt.Errorf("repair %s: select rows: %w", brokerTopic, err)
	}
	var (
		ids []int64
		id  int64
		agg string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &agg}, func() error {
		if f.auditor.BrokerTopic(topic, agg) == brokerTopic {
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("repair %s: select rows: %w", brokerTopic, err)
	}
	for chunk := range slices.Chunk(ids, repairBatch) {
		tag, err := tx.Exec(ctx, `
			UPDATE outbox SET published_at = NULL, next_attempt_at = NULL
			WHERE id = ANY($1) AND published_at IS NOT NULL`, chunk)
		if err != nil {
			return 0, 0, fmt.Errorf("repair %s: put rows back: %w", brokerTopic, err)
		}
		n += tag.RowsAffected()
	}
	if len(ids) > 0 {
		fromID = ids[0]
	}
	return n, fromID, nil
}

// noteTopics records in outbox_audit_topics the topics of a committed
// batch this process has not recorded yet: the audit covers their broker
// topics. Once per process and topic; a failure is retried with the next
// batch of the topic.
func (f *Forwarder) noteTopics(ctx context.Context, byTopic map[string]*[3]int) {
	if f.auditor == nil {
		return
	}
	var fresh []string
	f.mu.Lock()
	for t, c := range byTopic {
		if c[0] > 0 && !f.noted[t] {
			fresh = append(fresh, t)
		}
	}
	f.mu.Unlock()
	if len(fresh) == 0 || ctx.Err() != nil {
		return
	}
	_, err := f.cfg.Pool.Exec(ctx, `INSERT INTO outbox_audit_topics (topic) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`, fresh)
	if err != nil {
		f.cfg.Logger.Warn("record topics for the broker audit", "error", err.Error())
		return
	}
	f.mu.Lock()
	for _, t := range fresh {
		f.noted[t] = true
	}
	f.mu.Unlock()
}
