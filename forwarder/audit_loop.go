package forwarder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// auditLock, with a hash of the schema and the topic, keeps the audit of
// one topic to one instance at a time ("outa"): while partition 0 moves,
// two instances may both believe they hold it.
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
// off. Each outbox topic is audited in a transaction of its own, under an
// advisory lock of its own (another instance auditing it meanwhile is
// skipped): a broker topic that errs or answers slowly, or a long repair,
// holds back nothing of the other topics, and an error leaves that topic's
// state as it was. The errors are reported once every topic was tried.
func (f *Forwarder) Audit(ctx context.Context) error {
	if f.auditor == nil {
		return nil
	}
	rows, err := f.cfg.Pool.Query(ctx, `SELECT topic FROM outbox_audit_topics ORDER BY topic`)
	if err != nil {
		return fmt.Errorf("read audited topics (has `outflow migrate up` run?): %w", err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read audited topics: %w", err)
	}
	var errs []error
	woke := false
	for _, topic := range topics {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		results, err := f.auditTopic(ctx, topic)
		if err != nil {
			errs = append(errs, err)
		}
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
	}
	if woke {
		f.Wake()
	}
	return errors.Join(errs...)
}

// auditCallTimeout bounds one Auditor.Audit call: a broker topic whose
// broker does not answer is an error of that topic, not a stalled pass.
// A variable for the tests.
var auditCallTimeout = 15 * time.Second

// auditTopic audits topic's broker topics and repairs what they lost, in
// one transaction, and returns what it committed (nothing when another
// instance holds the topic's lock). The new states are recorded only with
// the repair, so a crash in between makes the next audit find the loss
// again: a duplicate repair, never a forgotten one. A broker topic whose
// audit errs keeps its state; the others are committed.
func (f *Forwarder) auditTopic(ctx context.Context, topic string) ([]auditResult, error) {
	tx, err := f.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin audit of %s: %w", topic, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var acquired bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema() || '/' || $2))`,
		auditLock, topic).Scan(&acquired); err != nil {
		return nil, fmt.Errorf("audit lock of %s: %w", topic, err)
	}
	if !acquired {
		return nil, nil
	}
	states := map[string][]byte{}
	rows, err := tx.Query(ctx, `SELECT broker_topic, state FROM outbox_audit WHERE topic = $1`, topic)
	if err != nil {
		return nil, fmt.Errorf("read audit states of %s: %w", topic, err)
	}
	var (
		bt    string
		state []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&bt, &state}, func() error {
		states[bt] = slices.Clone(state)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read audit states of %s: %w", topic, err)
	}

	var (
		results []auditResult
		errs    []error
	)
	lost := map[string]time.Time{} // broker topic -> repair from
	for _, bt := range f.auditor.Topics(topic) {
		actx, cancel := context.WithTimeout(ctx, auditCallTimeout)
		next, loss, err := f.auditor.Audit(actx, bt, states[bt])
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("audit %s: %w", bt, err))
			continue
		}
		results = append(results, auditResult{topic: topic, brokerTopic: bt, next: next, loss: loss})
		if loss != nil {
			lost[bt] = loss.Since.Add(-f.cfg.AuditMargin)
		}
	}
	if len(lost) > 0 {
		if err := f.waitForBatchesInFlight(ctx); err != nil {
			return nil, errors.Join(append(errs, err)...)
		}
		put, err := f.repair(ctx, tx, topic, lost)
		if err != nil {
			return nil, errors.Join(append(errs, err)...)
		}
		for i := range results {
			if p, ok := put[results[i].brokerTopic]; ok {
				results[i].rows, results[i].fromID = p.rows, p.fromID
			}
		}
	}
	if err := saveAudits(ctx, tx, results); err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, errors.Join(append(errs, fmt.Errorf("commit audit of %s: %w", topic, err))...)
	}
	return results, errors.Join(errs...)
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

// inFlightTimeout bounds the repair's wait for the batches in flight: a
// claim's transaction lasts as long as its publish, which the broker's own
// timeout bounds. A variable for the tests.
var inFlightTimeout = 30 * time.Second

// waitForBatchesInFlight returns once every batch that was being
// forwarded when it was called has committed its mark. A batch publishes
// before it marks: a row it sent before the loss, whose mark commits after
// the repair's select, would be neither seen as published by the repair
// nor on the broker. Every claim holds its partitions' rows FOR SHARE for
// its whole transaction, so locking them FOR UPDATE waits for exactly
// those; the lock is let go at once (claims queued behind it resume), and
// the repair's select, a statement of its own under READ COMMITTED, sees
// their marks. A claim that starts after this publishes after the loss was
// found, to what the broker has now: a later audit covers it.
func (f *Forwarder) waitForBatchesInFlight(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, inFlightTimeout)
	defer cancel()
	err := pgx.BeginFunc(wctx, f.cfg.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(wctx, `SELECT 1 FROM outbox_partitions FOR UPDATE`)
		return err
	})
	if err != nil {
		return fmt.Errorf("repair: wait for the batches in flight: %w", err)
	}
	return nil
}

// putBack is what a repair did on one broker topic: how many rows it put
// back, the smallest id among them.
type putBack struct{ rows, fromID int64 }

// repair puts back, for each broker topic of topic in lost, every row
// published at or after its time: published_at and next_attempt_at to
// NULL, so that the rows are pending again, in the pending-rows index, and
// are claimed through the normal path in id order (the claim holds an
// aggregate's later rows behind an earlier row waiting for a retry, so a
// due next_attempt_at would let through one row per aggregate per claim).
// attempts is kept: it counts the row's own failures, and a broker's loss
// is none.
//
// There is no index on published_at, on purpose: one would make every
// mark of a published row a non-HOT update. A loss is rare, so the repair
// scans the topic's retained rows once, whatever the number of its broker
// topics lost, and sorts them by broker topic here.
func (f *Forwarder) repair(ctx context.Context, tx pgx.Tx, topic string, lost map[string]time.Time) (map[string]putBack, error) {
	var from time.Time
	for _, t := range lost {
		if from.IsZero() || t.Before(from) {
			from = t
		}
	}
	rows, err := tx.Query(ctx, `SELECT id, aggregate_id, published_at FROM outbox WHERE topic = $1 AND published_at >= $2 ORDER BY id`, topic, from)
	if err != nil {
		return nil, fmt.Errorf("repair %s: select rows: %w", topic, err)
	}
	var (
		ids = map[string][]int64{}
		id  int64
		agg string
		at  time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &agg, &at}, func() error {
		bt := f.auditor.BrokerTopic(topic, agg)
		if since, ok := lost[bt]; ok && !at.Before(since) {
			ids[bt] = append(ids[bt], id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("repair %s: select rows: %w", topic, err)
	}
	put := make(map[string]putBack, len(lost))
	for bt, list := range ids {
		var p putBack
		for chunk := range slices.Chunk(list, repairBatch) {
			tag, err := tx.Exec(ctx, `
				UPDATE outbox SET published_at = NULL, next_attempt_at = NULL
				WHERE id = ANY($1) AND published_at IS NOT NULL`, chunk)
			if err != nil {
				return nil, fmt.Errorf("repair %s: put rows back: %w", bt, err)
			}
			p.rows += tag.RowsAffected()
		}
		p.fromID = list[0]
		put[bt] = p
	}
	return put, nil
}

// noteTopics records in outbox_audit_topics the topics of a committed
// batch this process has not recorded yet: the audit covers their broker
// topics. Once per process and topic; after a failure, it tries again with
// a batch at least an AuditInterval later: the audit reads the table no
// more often, and a failure that lasts (the table missing: migrations not
// run) logs once an interval, not once a batch.
func (f *Forwarder) noteTopics(ctx context.Context, byTopic map[string]*[3]int) {
	if f.auditor == nil {
		return
	}
	var fresh []string
	f.mu.Lock()
	if time.Now().Before(f.noteAfter) {
		f.mu.Unlock()
		return
	}
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
		f.mu.Lock()
		f.noteAfter = time.Now().Add(f.cfg.AuditInterval)
		f.mu.Unlock()
		f.cfg.Logger.Warn("record topics for the broker audit", "error", err.Error(), "retry_in", f.cfg.AuditInterval)
		return
	}
	f.mu.Lock()
	for _, t := range fresh {
		f.noted[t] = true
	}
	f.mu.Unlock()
}
