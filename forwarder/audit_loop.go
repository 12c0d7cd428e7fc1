package forwarder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/poll"
)

// repairBatch bounds one UPDATE of a repair.
const repairBatch = 1000

// auditHeldLimit bounds the receipts one audit hands to the broker: the
// oldest half and the newest half of the unsettled ones when there are
// more (a consumer group far behind keeps its receipts unsettled). The
// newest are where a failover or a restart loses messages; the oldest are
// those whose settling lets the broker trim. The ones in between wait for
// a later audit. auditRowLimit bounds the receipt rows read for each half.
// Variables for the tests.
var (
	auditHeldLimit = 20000
	auditRowLimit  = 2000
)

// auditLoop runs the broker audit while this instance holds partition 0
// (the instance that exports the outbox gauges). What a repair puts back
// goes into outbox_failures, where whichever instance holds its partition
// claims it: no other instance needs to be told.
func (f *Forwarder) auditLoop(ctx context.Context) {
	poll.Every(ctx, f.cfg.AuditInterval, func(ctx context.Context) error {
		if !f.exportsStats() {
			return nil
		}
		return f.Audit(ctx)
	}, poll.Warn(f.cfg.Logger, "broker audit"))
}

// receiptRow is one row of outbox_receipts: one batch's receipts.
type receiptRow struct {
	id                      int64
	publishedAt             time.Time
	outboxIDs               []int64
	brokerTopics, positions []string
}

// heldRef is one receipt of a receiptRow: the row's index, the element's.
type heldRef struct{ row, elem int }

// topicAudit is one broker topic's part of an audit.
type topicAudit struct {
	brokerTopic string
	topic       string // the outbox topic of its rows, for the metrics
	refs        []heldRef
	held        []Held
	verdict     Verdict
	err         error
	// What its repair did: the rows put back, the smallest of their ids,
	// the lost rows retention had already purged, and when the oldest
	// lost message was published.
	repaired, purged int64
	fromID           int64
	oldestLost       time.Time
}

// Audit checks, once, every receipt not yet settled (up to a bound, see
// auditHeldLimit) against the broker, forgets those every consumer had,
// and publishes again the rows whose messages the broker lost. The audit
// loop calls it every AuditInterval on the holder of partition 0; it is
// exported for tests and tools. It does nothing when the broker is no
// [Auditor], the audit is off, or another instance is auditing.
//
// It runs in one transaction: the judged receipts are deleted, the lost
// rows put back and the broker topics' states saved together, so a crash
// or an error before the commit leaves every receipt to the next audit (a
// repair done twice at worst, never one forgotten). A broker topic whose
// Check fails keeps its receipts as they were; the others are committed,
// and the errors returned.
func (f *Forwarder) Audit(ctx context.Context) error {
	if f.auditor == nil {
		return nil
	}
	// This instance's receipts first, rather than at its next lease tick;
	// other instances' come with theirs.
	if err := f.flushReceipts(ctx); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	repairs, err := RunAudit(ctx, f.cfg.Pool, f.auditor, outboxAuditStore, f.cfg.ShutdownTimeout, f.cfg.Logger)
	f.reportRepairs(repairs)
	return err
}

// AuditStore says where an audit's receipts, messages, repairs and states
// live: the outbox's tables for the forwarder (outboxAuditStore); the WAL
// relay (package walrelay) keeps its own beside its history, and audits
// them with [RunAudit] too, so both modes judge and repair by one rule.
type AuditStore struct {
	// Lock keys the transaction-scoped advisory lock, with the schema's
	// hash, that keeps the audit of this store to one process at a time.
	Lock advisory.Class
	// Receipts is the receipts' table: id (bigint, in write order),
	// published_at, and the parallel arrays IDs (bigint[], the rows the
	// receipts are of), broker_topics and positions (text[]).
	Receipts, IDs string
	// States is a table like outbox_audit: the auditor's state per broker
	// topic, and the last loss.
	States string
	// Messages reads, for the row ids $1 (bigint[]), each row's id,
	// message_id (text) and topic.
	Messages string
	// Repair puts the rows $1 (bigint[]) back to be published again, in
	// their aggregates' order, and returns how many it put back and how
	// many of them it found (a row retention removed is not found).
	Repair string
}

// outboxAuditStore is the forwarder's: receipts in outbox_receipts, rows
// put back into outbox_failures (kind repair).
var outboxAuditStore = AuditStore{
	Lock:     advisory.ForwarderAudit,
	Receipts: "outbox_receipts",
	IDs:      "outbox_ids",
	States:   "outbox_audit",
	Messages: `SELECT id, message_id::text, topic FROM outbox WHERE id = ANY($1)`,
	Repair: `
		WITH put AS (
			INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, next_attempt_at)
			SELECT id, aggregate_type, aggregate_id, 'repair', now() FROM outbox WHERE id = ANY($1)
			ON CONFLICT (id) DO NOTHING
			RETURNING 1)
		SELECT (SELECT count(*) FROM put), (SELECT count(*) FROM outbox WHERE id = ANY($1))`,
}

// AuditRepair is what an audit put back for one broker topic that lost
// messages, for the caller's metrics and logs.
type AuditRepair struct {
	Topic, BrokerTopic, Reason string
	// Repaired rows were put back; Purged were lost by the broker but
	// gone from the store already (retention).
	Repaired, Purged int64
	// OldestLost is when the oldest lost message's receipt was written.
	OldestLost time.Time
}

// RunAudit checks, once, the receipts of store not yet settled (up to a
// bound, see auditHeldLimit) against a, forgets those every consumer had,
// and puts back the rows whose messages the broker lost (see
// [Forwarder.Audit]). It does nothing when another process is auditing
// the store. writeTimeout bounds the writing of the verdicts, which goes
// on after ctx ends.
//
// It runs in one transaction: the judged receipts are deleted, the lost
// rows put back and the broker topics' states saved together, so a crash
// or an error before the commit leaves every receipt to the next audit (a
// repair done twice at worst, never one forgotten). A broker topic whose
// Check fails keeps its receipts as they were; the others are committed,
// and the errors returned with what was repaired.
func RunAudit(ctx context.Context, pool *pgxpool.Pool, a Auditor, store AuditStore, writeTimeout time.Duration, logger *slog.Logger) ([]AuditRepair, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin audit: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	acquired, err := advisory.Try(ctx, tx, store.Lock)
	if err != nil {
		return nil, fmt.Errorf("audit lock: %w", err)
	}
	if !acquired {
		return nil, nil
	}
	receipts, partial, err := loadReceipts(ctx, tx, store, logger)
	if err != nil {
		return nil, err
	}
	audits, err := heldByBrokerTopic(ctx, tx, store, receipts)
	if err != nil {
		return nil, err
	}
	if len(audits) == 0 {
		return nil, tx.Commit(ctx)
	}
	errs := check(ctx, a, audits, partial)
	// The verdicts are written whatever happens to ctx now (a shutdown):
	// a verdict some Check acted on (a Redis trim) must be committed, or
	// the next audit would take what it removed for lost.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if _, err := tx.Exec(wctx, `SELECT set_config('lock_timeout', '10s', true)`); err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	if err := repair(wctx, tx, store, receipts, audits); err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	if err := forgetJudged(wctx, tx, store, receipts, audits); err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	if err := saveAudits(wctx, tx, store, audits); err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	if err := tx.Commit(wctx); err != nil {
		return nil, errors.Join(append(errs, fmt.Errorf("commit audit: %w", err))...)
	}
	var repairs []AuditRepair
	for _, a := range audits {
		if a.err != nil || a.oldestLost.IsZero() {
			continue
		}
		repairs = append(repairs, AuditRepair{Topic: a.topic, BrokerTopic: a.brokerTopic, Reason: a.verdict.Reason,
			Repaired: a.repaired, Purged: a.purged, OldestLost: a.oldestLost})
	}
	return repairs, errors.Join(errs...)
}

// loadReceipts reads the unsettled receipts, in id (commit) order: all of
// them, or, past auditRowLimit rows or auditHeldLimit receipts, the oldest
// rows up to half the bound and the newest up to the other half, and then
// partial is true. A row whose arrays differ in length (written by hand)
// cannot be judged: it is left, and said.
func loadReceipts(ctx context.Context, tx pgx.Tx, store AuditStore, logger *slog.Logger) (rows []receiptRow, partial bool, err error) {
	read := func(q string, args ...any) ([]receiptRow, error) {
		r, err := tx.Query(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("read receipts (has `outflow migrate up` run?): %w", err)
		}
		all, err := pgx.CollectRows(r, func(r pgx.CollectableRow) (receiptRow, error) {
			var x receiptRow
			err := r.Scan(&x.id, &x.publishedAt, &x.outboxIDs, &x.brokerTopics, &x.positions)
			return x, err
		})
		if err != nil {
			return nil, fmt.Errorf("read receipts: %w", err)
		}
		return all, nil
	}
	cols := `SELECT id, published_at, ` + store.IDs + `, broker_topics, positions FROM ` + store.Receipts
	head, err := read(cols+` ORDER BY id LIMIT $1`, auditRowLimit)
	if err != nil || len(head) == 0 {
		return nil, false, err
	}
	var tail []receiptRow
	if len(head) == auditRowLimit {
		// One row more than the bound says whether rows lie between.
		if tail, err = read(cols+` WHERE id > $1 ORDER BY id DESC LIMIT $2`, head[len(head)-1].id, auditRowLimit+1); err != nil {
			return nil, false, err
		}
		if partial = len(tail) > auditRowLimit; partial {
			tail = tail[:auditRowLimit]
		}
		slices.Reverse(tail)
	}
	all := append(head, tail...)
	total := 0
	for _, r := range all {
		total += len(r.positions)
	}
	if total > auditHeldLimit {
		// The oldest rows up to half the bound, the newest up to the
		// other half.
		partial = true
		var n, first int
		for first = 0; first < len(all) && n < auditHeldLimit/2; first++ {
			n += len(all[first].positions)
		}
		last := len(all)
		for n = 0; last > first && n < auditHeldLimit/2; {
			last--
			n += len(all[last].positions)
		}
		all = append(all[:first:first], all[last:]...)
	}
	rows = all[:0]
	for _, r := range all {
		if len(r.brokerTopics) != len(r.outboxIDs) || len(r.positions) != len(r.outboxIDs) {
			logger.Error("broker audit: a receipt row whose arrays differ in length is left unjudged", "table", store.Receipts, "receipt_id", r.id)
			continue
		}
		rows = append(rows, r)
	}
	return rows, partial, nil
}

// checkParallel bounds the Checks of one audit running at once, and
// checkPhase the time they may take together: a broker that does not
// answer costs each broker topic auditCallTimeout, and an audit's
// transaction stays open meanwhile. Broker topics whose turn comes after
// checkPhase are errors of this audit, checked at the next. Variables for
// the tests.
var (
	checkParallel = 4
	checkPhase    = 2 * auditCallTimeout
)

// check runs Check on each broker topic, a few at a time, and returns the
// errors; a broker topic with an error keeps its receipts as they were.
func check(ctx context.Context, auditor Auditor, audits []*topicAudit, partial bool) []error {
	phase, cancel := context.WithTimeout(ctx, checkPhase)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, checkParallel)
	for _, a := range audits {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-phase.Done():
				a.err = fmt.Errorf("audit %s: not checked within %s: %w", a.brokerTopic, checkPhase, phase.Err())
				return
			}
			actx, cancel := context.WithTimeout(phase, auditCallTimeout)
			defer cancel()
			a.verdict, a.err = auditor.Check(actx, a.brokerTopic, a.verdict.State, a.held, partial)
			if a.err == nil && len(a.verdict.Status) != len(a.held) {
				a.err = fmt.Errorf("the auditor returned %d statuses for %d messages", len(a.verdict.Status), len(a.held))
			}
			if a.err != nil {
				a.err = fmt.Errorf("audit %s: %w", a.brokerTopic, a.err)
			}
		})
	}
	wg.Wait()
	var errs []error
	for _, a := range audits {
		if a.err != nil {
			errs = append(errs, a.err)
		}
	}
	return errs
}

// heldByBrokerTopic groups the receipts by broker topic, with their
// message ids (and outbox topics) from the outbox, and the broker topics'
// saved states in verdict.State.
func heldByBrokerTopic(ctx context.Context, tx pgx.Tx, store AuditStore, receipts []receiptRow) ([]*topicAudit, error) {
	var ids []int64
	for _, r := range receipts {
		ids = append(ids, r.outboxIDs...)
	}
	type msg struct{ id, topic string }
	msgs := make(map[int64]msg, len(ids))
	rows, err := tx.Query(ctx, store.Messages, ids) // none: no row
	if err != nil {
		return nil, fmt.Errorf("read the receipts' messages: %w", err)
	}
	var (
		id       int64
		mid, top string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &mid, &top}, func() error {
		msgs[id] = msg{mid, top}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read the receipts' messages: %w", err)
	}

	byTopic := map[string]*topicAudit{}
	var audits []*topicAudit
	for ri, r := range receipts {
		for e, bt := range r.brokerTopics {
			a := byTopic[bt]
			if a == nil {
				a = &topicAudit{brokerTopic: bt, topic: bt}
				byTopic[bt] = a
				audits = append(audits, a)
			}
			m, ok := msgs[r.outboxIDs[e]]
			if ok {
				a.topic = m.topic
			}
			a.refs = append(a.refs, heldRef{ri, e})
			a.held = append(a.held, Held{Position: r.positions[e], MessageID: m.id})
		}
	}
	names := make([]string, len(audits))
	for i, a := range audits {
		names[i] = a.brokerTopic
	}
	// The states of those broker topics, and the broker topics whose last
	// Check asked to be checked again, receipts or not.
	rows, err = tx.Query(ctx, `SELECT broker_topic, topic, state FROM `+store.States+` WHERE broker_topic = ANY($1) OR again`, names)
	if err != nil {
		return nil, fmt.Errorf("read audit states: %w", err)
	}
	var (
		bt    string
		state []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&bt, &top, &state}, func() error {
		a := byTopic[bt]
		if a == nil {
			a = &topicAudit{brokerTopic: bt, topic: top}
			byTopic[bt] = a
			audits = append(audits, a)
		}
		a.verdict.State = slices.Clone(state)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read audit states: %w", err)
	}
	slices.SortFunc(audits, func(a, b *topicAudit) int { return cmp.Compare(a.brokerTopic, b.brokerTopic) })
	return audits, nil
}

// repair puts back the rows whose messages a broker topic lost: into
// outbox_failures, due at once, where the claim of whichever instance
// holds their partition finds them, and holds their aggregates' later
// rows behind them, so they go out again in id order. attempts starts at
// 0: a broker's loss is not the row's failure. A row already there (it
// failed since) is left as it is: it is on its way again. It touches those
// rows only, by id: a repair costs what it repairs, and holds no claim of
// any forwarder.
//
// No wait for the batches in flight is needed: a batch that published
// before the loss and commits after this has its receipts written later
// (a lease tick, or its own transaction for rows of outbox_failures), and
// the next audit checks them.
func repair(ctx context.Context, tx pgx.Tx, store AuditStore, receipts []receiptRow, audits []*topicAudit) error {
	for _, a := range audits {
		if a.err != nil {
			continue
		}
		var lost []int64
		for k, s := range a.verdict.Status {
			if s != Lost {
				continue
			}
			r := receipts[a.refs[k].row]
			lost = append(lost, r.outboxIDs[a.refs[k].elem])
			if a.oldestLost.IsZero() || r.publishedAt.Before(a.oldestLost) {
				a.oldestLost = r.publishedAt
			}
		}
		if len(lost) == 0 {
			continue
		}
		slices.Sort(lost)
		lost = slices.Compact(lost)
		a.fromID = lost[0]
		for chunk := range slices.Chunk(lost, repairBatch) {
			var put, found int64
			err := tx.QueryRow(ctx, store.Repair, chunk).Scan(&put, &found)
			if err != nil {
				return fmt.Errorf("repair %s: put rows back: %w", a.brokerTopic, err)
			}
			a.repaired += put
			a.purged += int64(len(chunk)) - found
		}
	}
	return nil
}

// forgetJudged deletes the receipts judged Settled or Lost, and rewrites a
// row some of whose receipts stay (Unsettled, or of a broker topic whose
// Check failed).
func forgetJudged(ctx context.Context, tx pgx.Tx, store AuditStore, receipts []receiptRow, audits []*topicAudit) error {
	done := make([][]bool, len(receipts))
	for i, r := range receipts {
		done[i] = make([]bool, len(r.positions))
	}
	for _, a := range audits {
		if a.err != nil {
			continue
		}
		for k, s := range a.verdict.Status {
			if s == Settled || s == Lost {
				done[a.refs[k].row][a.refs[k].elem] = true
			}
		}
	}
	var (
		gone []int64
		b    = &pgx.Batch{}
	)
	for i, r := range receipts {
		var keep receiptRow
		for e, d := range done[i] {
			if !d {
				keep.outboxIDs = append(keep.outboxIDs, r.outboxIDs[e])
				keep.brokerTopics = append(keep.brokerTopics, r.brokerTopics[e])
				keep.positions = append(keep.positions, r.positions[e])
			}
		}
		switch len(keep.positions) {
		case 0:
			gone = append(gone, r.id)
		case len(r.positions):
		default:
			b.Queue(`UPDATE `+store.Receipts+` SET `+store.IDs+` = $2, broker_topics = $3, positions = $4 WHERE id = $1`,
				r.id, keep.outboxIDs, keep.brokerTopics, keep.positions)
		}
	}
	if len(gone) > 0 {
		b.Queue(`DELETE FROM `+store.Receipts+` WHERE id = ANY($1)`, gone)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("forget judged receipts: %w", err)
	}
	return nil
}

func saveAudits(ctx context.Context, tx pgx.Tx, store AuditStore, audits []*topicAudit) error {
	b := &pgx.Batch{}
	for _, a := range audits {
		if a.err != nil {
			continue
		}
		if a.oldestLost.IsZero() {
			b.Queue(`
				INSERT INTO `+store.States+` (broker_topic, topic, state, again) VALUES ($1, $2, $3, $4)
				ON CONFLICT (broker_topic) DO UPDATE SET topic = excluded.topic, state = excluded.state, again = excluded.again,
					audited_at = now()`,
				a.brokerTopic, a.topic, a.verdict.State, a.verdict.Again)
			continue
		}
		var from *int64
		if a.repaired > 0 {
			from = &a.fromID
		}
		reason := a.verdict.Reason
		if reason == "" {
			reason = "lost (the auditor gave no reason)"
		}
		b.Queue(`
			INSERT INTO `+store.States+` (broker_topic, topic, state, again, last_loss_at, last_loss_reason, last_loss_since, last_repaired, repair_from_id)
			VALUES ($1, $2, $3, $8, clock_timestamp(), $4, $5, $6, $7)
			ON CONFLICT (broker_topic) DO UPDATE SET topic = excluded.topic, state = excluded.state, again = excluded.again, audited_at = now(),
				last_loss_at = excluded.last_loss_at, last_loss_reason = excluded.last_loss_reason, last_loss_since = excluded.last_loss_since,
				last_repaired = excluded.last_repaired,
				repair_from_id = coalesce(excluded.repair_from_id, `+store.States+`.repair_from_id)`,
			a.brokerTopic, a.topic, a.verdict.State, reason, a.oldestLost, a.repaired, from, a.verdict.Again)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("save audit states: %w", err)
	}
	return nil
}

// reportRepairs counts and logs the committed repairs, and wakes the
// claim for the rows put back in outbox_failures.
func (f *Forwarder) reportRepairs(repairs []AuditRepair) {
	LogRepairs(f.cfg.Logger, repairs)
	woke := false
	for _, r := range repairs {
		f.metrics.brokerLosses.WithLabelValues(r.Topic).Inc()
		f.metrics.repaired.WithLabelValues(r.Topic).Add(float64(r.Repaired))
		woke = woke || r.Repaired > 0
	}
	if woke {
		f.Wake()
	}
}

// LogRepairs logs what [RunAudit] repaired: a Warn line per broker topic
// that lost messages, and an Error line when some were gone from the store
// already (retention) and cannot be published again.
func LogRepairs(logger *slog.Logger, repairs []AuditRepair) {
	for _, r := range repairs {
		logger.Warn("broker lost acknowledged messages: publishing them again",
			"topic", r.Topic, "broker_topic", r.BrokerTopic, "reason", r.Reason,
			"oldest_published_at", r.OldestLost.UTC().Format(time.RFC3339Nano), "rows", r.Repaired)
		if r.Purged > 0 {
			logger.Error("broker lost messages whose rows retention already purged: they cannot be published again",
				"topic", r.Topic, "broker_topic", r.BrokerTopic, "rows", r.Purged)
		}
	}
}

// auditCallTimeout bounds one Auditor.Check call: a broker topic whose
// broker does not answer is an error of that topic, not a stalled pass.
// A variable for the tests.
var auditCallTimeout = 15 * time.Second
