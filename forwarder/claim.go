package forwarder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/backoff"
)

// activeSet is the partition set the claims serve (ps: its first_id, base
// and count), the oldest of outbox_partition_sets, and nextSet where the
// next set's rows begin (nx.upto, NULL without one): while the partition
// count changes, the active set's partitions publish only the rows below
// it, and the next set's wait (see RepartitionOnline).
const activeSet = `ps AS MATERIALIZED (
    SELECT first_id, base, count FROM outbox_partition_sets ORDER BY first_id LIMIT 1
), nx AS MATERIALIZED (
    SELECT min(first_id) AS upto FROM outbox_partition_sets WHERE first_id > (SELECT first_id FROM ps)
)`

// partitionOfRow is partitionOf with the set's base and count as InitPlans
// (evaluated once), for a query on the outbox alone: joined to ps, the
// outbox would lose its id order, and a claim would sort its whole
// backlog for a batch.
const partitionOfRow = `((SELECT base FROM ps) + ((hashtextextended(o.aggregate_id, 0) % (SELECT count FROM ps)) + (SELECT count FROM ps)) % (SELECT count FROM ps))`

// partitionOf maps a row (o) to its partition in the active set (ps).
// hashtextextended is stable within a PostgreSQL major version, which is
// all a lease needs: rows are not stored by partition, they are only
// assigned at claim time.
const partitionOf = `(ps.base + ((hashtextextended(o.aggregate_id, 0) % ps.count) + ps.count) % ps.count)`

// rowColumns are what a claim reads of an outbox row (o).
const rowColumns = `o.id, o.message_id::text, o.topic, o.aggregate_type, o.aggregate_id, o.aggregate_version,
       o.event_type, o.payload::text, o.metadata::text, o.occurred_at`

// claimTemplate reads, in one statement (one snapshot), what this instance
// may publish of the partitions it leases, in four parts told apart by the
// first column:
//
//   - S: the statement's snapshot, from which the cursor learns which of
//     the transactions running a moment before committed since;
//   - P: each leased partition of the active set and its
//     published_through, of those the claim's transaction holds the fence
//     on ($7, fenceClaimSQL): another instance cannot take a partition
//     while this transaction, which publishes its rows, is open;
//   - N: new rows, above each partition's high ($1 and $3, or
//     published_through for a partition the cursor has not seen), but those
//     read ahead ($6) and those of a next partition set, the first
//     batchLimit in id order;
//   - L: late rows, of tracked transactions ($4, their bounds $5) the
//     snapshot shows committed, between their bound and the partition's
//     high. The outbox has no index on transaction_id (each would cost
//     every insert), so they are read in one id range scan, from the
//     lowest bound to the highest high (late): joined to fin directly,
//     the planner read every row below the highs, once per partition,
//     and the claim slowed as the outbox grew (docs/benchmarks.md).
//
// The batch size is written into the statement (claimQuery), not passed,
// and the claim runs with sorting off (claimPlanBefore): the prepared
// claim runs on PostgreSQL's generic plan after five runs, which must not
// sort the backlog. A custom plan per claim cost about 10 ms of planning
// a claim, most of what a claim cost under a steady flow of commits.
//
// A row in outbox_failures is read from there instead (failuresSQL).
// blocked says an earlier row of the aggregate is in outbox_failures: the
// row is held behind it, not sent. No row is locked: a row is no claim's,
// only a partition is, through its fence.
const claimTemplate = `
WITH ` + activeSet + `, mine AS MATERIALIZED (
    SELECT partition, published_through FROM outbox_partitions
    WHERE owner = $2 AND lease_until > now() AND partition = ANY($7::int[])
      AND partition >= (SELECT base FROM ps) AND partition < (SELECT base + count FROM ps)
), hi AS MATERIALIZED (
    SELECT m.partition, m.published_through, greatest(m.published_through, coalesce(h.high, -1)) AS high
    FROM mine m LEFT JOIN unnest($1::int[], $3::bigint[]) AS h(partition, high) ON h.partition = m.partition
), fin AS MATERIALIZED (
    SELECT t.x::xid8 AS x, t.b FROM unnest($4::text[], $5::bigint[]) AS t(x, b)
    WHERE pg_visible_in_snapshot(t.x::xid8, pg_current_snapshot())
), late AS MATERIALIZED (
    SELECT o.* FROM outbox o
    WHERE o.id > (SELECT min(b) FROM fin) AND o.id <= (SELECT max(high) FROM hi)
      AND o.transaction_id = ANY(ARRAY(SELECT x FROM fin))
)
SELECT 'S', NULL::int, NULL::bigint, pg_current_snapshot()::text, NULL::text, ` + nullRow + `, false
UNION ALL
SELECT 'P', partition, published_through, NULL, NULL, ` + nullRow + `, false FROM hi
UNION ALL
(SELECT 'N', ` + partitionOfRow + `::int, NULL, NULL, NULL, ` + rowColumns + `, ` + blockedExpr + `
 FROM outbox o
 WHERE o.id > (SELECT min(high) FROM hi) AND o.id < coalesce((SELECT upto FROM nx), 9223372036854775807)
   AND o.id > (SELECT hi.high FROM hi WHERE hi.partition = ` + partitionOfRow + `)
   AND o.id <> ALL($6::bigint[])
   AND o.id <> ALL(ARRAY(SELECT f.id FROM outbox_failures f WHERE f.id > (SELECT min(high) FROM hi)))
 ORDER BY o.id LIMIT ` + batchLimit + `)
UNION ALL
SELECT 'L', hi.partition, NULL, NULL, fin.x::text, ` + rowColumns + `, ` + blockedExpr + `
FROM fin JOIN late o ON o.transaction_id = fin.x AND o.id > fin.b
CROSS JOIN ps JOIN hi ON hi.partition = ` + partitionOf + `
WHERE o.id <= hi.high AND o.id < coalesce((SELECT upto FROM nx), 9223372036854775807)
  AND NOT EXISTS (SELECT 1 FROM outbox_failures f WHERE f.id = o.id)`

// claimPlanBefore and claimPlanAfter surround the claim statement: its
// plan must read the rows above the cursor in id order and stop at the
// batch, but the estimates of its filters (a two-sided id range of
// unknown bounds, rows above each partition's own high, rows read ahead)
// make the planner expect a few rows and prefer reading them all and
// sorting them: the whole backlog for each batch, after an outage. With
// sorting off for that one statement, only the ordered plan (a Merge
// Append of the partitions' primary keys) is left.
const (
	claimPlanBefore = `SELECT set_config('enable_sort', 'off', true)`
	claimPlanAfter  = `SELECT set_config('enable_sort', 'on', true)`
)

// batchLimit is where claimQuery writes the batch size.
const batchLimit = "{{batch}}"

// claimQuery is claimTemplate for batches of n rows.
func claimQuery(n int) string {
	return strings.Replace(claimTemplate, batchLimit, strconv.Itoa(n), 1)
}

const nullRow = `NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::timestamptz`

// blockedExpr: an earlier row of o's aggregate is in outbox_failures.
const blockedExpr = `EXISTS (SELECT 1 FROM outbox_failures b
    WHERE b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id AND b.id < o.id)`

// outboxWritersSQL lists the transactions running, each with whether it
// holds a lock on this schema's outbox or one of its partitions: those
// that may have written rows to it (see cursor.rebound). Run after the
// sequence is read and before the claim's snapshot: a transaction that
// committed releases its locks on tables before the lock on its
// transaction id, and leaves the running ones (as snapshots see them)
// before either. Read after the snapshot, a writer that committed in
// between could be listed as running with no lock on the outbox, its
// bound raised above its rows, and its rows skipped; read before, such a
// transaction already shows committed in the snapshot, whose claim reads
// its rows from its old bound.
const outboxWritersSQL = `
SELECT x.transactionid::text, bool_or(r.locktype IS NOT NULL)
FROM pg_locks x LEFT JOIN pg_locks r ON r.virtualtransaction = x.virtualtransaction
    AND r.locktype = 'relation' AND r.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND (r.relation = 'outbox'::regclass OR r.relation IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox'::regclass))
WHERE x.locktype = 'transactionid' AND x.mode = 'ExclusiveLock' AND x.granted
GROUP BY 1`

// failuresSQL takes the rows of outbox_failures of the partitions this
// instance leases that are due: held rows, rows to repair, failed rows
// whose retry is due, unless an earlier row of their aggregate is parked
// or not due yet, of the partitions fenced ($3). FOR UPDATE: an operator's
// retry or discard of the same row waits for the batch, as the batch waits
// for it.
const failuresSQL = `
WITH ` + activeSet + `
SELECT ` + rowColumns + `, f.attempts, f.discarded_at, f.kind
FROM outbox_failures f JOIN outbox o ON o.id = f.id CROSS JOIN ps
WHERE ` + partitionOf + ` = ANY(ARRAY(SELECT partition FROM outbox_partitions
                                    WHERE owner = $2 AND lease_until > now() AND partition = ANY($3::int[])))
  AND o.id < coalesce((SELECT upto FROM nx), 9223372036854775807)
  AND f.parked_at IS NULL AND (f.next_attempt_at IS NULL OR f.next_attempt_at <= now())
  AND NOT EXISTS (
      SELECT 1 FROM outbox_failures b
      WHERE b.aggregate_type = f.aggregate_type AND b.aggregate_id = f.aggregate_id AND b.id < f.id
        AND (b.parked_at IS NOT NULL OR b.next_attempt_at > now()))
ORDER BY f.id
LIMIT $1
FOR UPDATE OF f`

type row struct {
	id            int64
	messageID     string
	topic         string
	aggregateType string
	aggregateID   string
	version       int64
	eventType     string
	payload       string
	metadata      string
	occurredAt    time.Time
	attempts      int
	discardedAt   *time.Time // an operator discarded it: its message is the discard marker

	partition int32
	// failure: the row was read from outbox_failures (its kind); late: of
	// the tracked transaction xid; blocked: an earlier row of its
	// aggregate is in outbox_failures.
	failure string
	late    string
	blocked bool
}

// batchResult is what one claim did.
type batchResult struct {
	claimed, published, failed, parked, held int
	unavailable                              error
	// byTopic counts published, failed (parked included) and parked rows
	// per topic, for the metrics once the batch commits.
	byTopic map[string]*[3]int
}

func (r *batchResult) countTopic(topic string, i int) {
	if r.byTopic == nil {
		r.byTopic = make(map[string]*[3]int, 2)
	}
	c := r.byTopic[topic]
	if c == nil {
		c = new([3]int)
		r.byTopic[topic] = c
	}
	c[i]++
}

// claim is what claimSQL and failuresSQL read.
type claim struct {
	l        int64    // the id sequence's last value, read before the snapshot
	running  []uint32 // the transactions running, read after l and before the snapshot
	snap     snapshot
	owned    map[int32]int64 // leased partition -> published_through
	rows     []row           // failures first, then new and late rows, each in id order
	newRows  int
	lastNew  int64
	snapRead bool
}

// forwardBatch claims a batch in one transaction, publishes it, records
// what went wrong and commits. The transaction stays open during the
// publish on purpose: it holds the partitions' fence, so no other
// instance publishes them meanwhile, and a crash at any point leaves the
// cursor where it was: the rows are published again (a duplicate, never a
// loss).
func (f *Forwarder) forwardBatch(ctx context.Context) (res batchResult, err error) {
	start := time.Now()
	tx, err := f.cfg.Pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("begin claim: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	c, err := f.claim(ctx, tx)
	if err != nil {
		return res, err
	}
	f.cur.own(c.owned)
	res.claimed = len(c.rows)
	if len(c.rows) == 0 {
		f.cur.advance(c.l, c.running, c.snap, 0, f.cfg.BatchSize, 0, nil, nil, nil)
		return res, tx.Commit(ctx)
	}

	claimed := c.rows
	msgs, results := f.prepare(claimed)
	var receipts []Receipt // claimed[i]'s when the broker is audited and took it
	if f.auditor != nil {
		receipts = make([]Receipt, len(claimed))
	}
	// The publish and the marks run even if ctx ends now: finishing the
	// batch is cheaper than publishing it twice.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.PublishTimeout)
	defer cancel()
	pubStart := time.Now()
	if f.publishWaves(pctx, claimed, msgs, results, receipts) > 0 {
		f.metrics.publishSeconds.Observe(time.Since(pubStart).Seconds())
	}

	marks := f.classify(claimed, results, receipts, &res)
	if f.receipts.count()+marks.deferred.len() > maxPendingReceipts {
		marks.inTx.addAll(marks.deferred)
		marks.deferred = receiptSet{}
	}
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.ShutdownTimeout)
	defer mcancel()
	if err := f.mark(mctx, tx, marks); err != nil {
		return res, err
	}
	if err := tx.Commit(mctx); err != nil {
		return res, fmt.Errorf("commit outbox batch: %w", err)
	}
	// Before the cursor moves past the rows: a lease tick that records it
	// there writes these too (pendingReceipts).
	f.receipts.add(marks.deferred)
	f.cur.advance(c.l, c.running, c.snap, c.newRows, f.cfg.BatchSize, c.lastNew, marks.done, marks.unsent, marks.lateUnsent)
	f.cur.published.Add(int64(res.published))
	f.metrics.batchSeconds.Observe(time.Since(start).Seconds())
	for topic, c := range res.byTopic {
		f.metrics.forwarded.WithLabelValues(topic).Add(float64(c[0]))
		f.metrics.failedAttempts.WithLabelValues(topic).Add(float64(c[1]))
		f.metrics.parked.WithLabelValues(topic).Add(float64(c[2]))
	}
	return res, nil
}

// claim takes, in tx, the fence of the partitions this instance leases,
// then reads the id sequence's last value, then (in one statement, so
// after it) the partitions, the new and the late rows, then the due rows
// of outbox_failures.
func (f *Forwarder) claim(ctx context.Context, tx pgx.Tx) (claim, error) {
	c := claim{owned: map[int32]int64{}}
	parts, highs := f.cur.highs()
	xs, bs := f.cur.trackedArgs()
	var failures []row
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(f.cfg.ClaimLockTimeout.Milliseconds(), 10))
	// What the claim's transaction writes (the failures, the receipts)
	// need not wait for its WAL flush: if PostgreSQL crashes and loses
	// them, the rows are published again (a duplicate, which consumers
	// absorb), never lost. The broker already has them.
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	// The fence first, in a round trip of its own: the claim's snapshot
	// must come after it (a takeover that committed while the claim waited
	// shows there), and the claim serves only what it fenced.
	var fenced []int32
	b.Queue(fenceClaimSQL, f.cfg.InstanceID).Query(func(rows pgx.Rows) error {
		var err error
		fenced, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return c, fmt.Errorf("fence the leased partitions: %w", err)
	}
	if fenced == nil {
		fenced = []int32{}
	}
	b = &pgx.Batch{}
	b.Queue(`SELECT coalesce(pg_sequence_last_value('outbox_id_seq'), 0)`).QueryRow(func(r pgx.Row) error { return r.Scan(&c.l) })
	// Every transaction with a transaction id holds an exclusive lock on
	// it while it runs: the running ones, read after L and before the
	// claim's snapshot (see cursor).
	b.Queue(`SELECT transactionid::text::bigint FROM pg_locks WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted`).
		Query(func(rows pgx.Rows) error {
			var x int64
			_, err := pgx.ForEachRow(rows, []any{&x}, func() error {
				c.running = append(c.running, uint32(x))
				return nil
			})
			return err
		})
	var writers map[string]bool // running transaction -> writes to the outbox
	if f.cur.needsRebound(time.Now()) {
		writers = map[string]bool{}
		b.Queue(outboxWritersSQL).Query(func(rows pgx.Rows) error {
			var (
				x string
				w bool
			)
			_, err := pgx.ForEachRow(rows, []any{&x, &w}, func() error {
				writers[x] = w
				return nil
			})
			return err
		})
	}
	b.Queue(claimPlanBefore)
	b.Queue(f.claimSQL, parts, f.cfg.InstanceID, highs, xs, bs, f.cur.aheadArgs(), fenced).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				part      string
				partition *int32
				through   *int64
				snap, xid *string
				x         row
				id, ver   *int64
				mid, top  *string
				at, aid   *string
				et, pl    *string
				md        *string
				occ       *time.Time
			)
			if err := rows.Scan(&part, &partition, &through, &snap, &xid, &id, &mid, &top, &at, &aid, &ver, &et, &pl, &md, &occ, &x.blocked); err != nil {
				return err
			}
			switch part {
			case "S":
				sn, ok := parseSnapshot(*snap)
				if !ok {
					return fmt.Errorf("unreadable snapshot %q", *snap)
				}
				c.snap, c.snapRead = sn, true
			case "P":
				c.owned[*partition] = *through
			default:
				x.id, x.messageID, x.topic, x.aggregateType, x.aggregateID, x.version = *id, *mid, *top, *at, *aid, *ver
				x.eventType, x.payload, x.metadata, x.occurredAt, x.partition = *et, *pl, *md, *occ, *partition
				if part == "L" {
					x.late = *xid
				} else {
					c.newRows++
					c.lastNew = max(c.lastNew, x.id)
				}
				c.rows = append(c.rows, x)
			}
		}
		return rows.Err()
	})
	b.Queue(claimPlanAfter)
	b.Queue(failuresSQL, f.cfg.BatchSize, f.cfg.InstanceID, fenced).Query(func(rows pgx.Rows) error {
		var err error
		failures, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.id, &x.messageID, &x.topic, &x.aggregateType, &x.aggregateID, &x.version,
				&x.eventType, &x.payload, &x.metadata, &x.occurredAt, &x.attempts, &x.discardedAt, &x.failure)
			return x, err
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return c, fmt.Errorf("claim outbox batch: %w", err)
	}
	if !c.snapRead {
		return c, errors.New("claim outbox batch: no snapshot read")
	}
	if writers != nil {
		f.cur.rebound(c.l, writers, c.snap, time.Now())
	}
	// The failures go first: they are older than anything above the
	// highs, and an aggregate's new rows are held behind them anyway.
	slices.SortFunc(c.rows, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	c.rows = append(failures, c.rows...)
	return c, nil
}

// prepare builds the broker messages. A row that cannot be turned into a
// message (or cannot fit the broker), or that is held behind an earlier
// row of its aggregate in outbox_failures, gets its error here, without
// being sent; msgs[i] is claimed[i]'s message when results[i] is nil.
func (f *Forwarder) prepare(claimed []row) ([]Outgoing, []error) {
	results := make([]error, len(claimed))
	msgs := make([]Outgoing, len(claimed))
	lim := f.brokerLimit()
	for i, r := range claimed {
		if r.blocked {
			results[i] = errHeld
			continue
		}
		msg, err := f.message(r)
		if err == nil {
			msgs[i] = Outgoing{Topic: r.topic, AggregateID: r.aggregateID, Message: msg}
			err = f.checkSize(lim, msgs[i])
		}
		results[i] = err
	}
	return msgs, results
}

// publishWaves hands the batch to the broker in waves: wave k holds the
// k-th row of each aggregate present in the batch, in claim (id) order, one
// Publish call per wave. After a wave, an aggregate whose row failed, for
// its own reason or the broker's, is blocked: its later rows are not sent
// and get errHeld. So an aggregate's next event never reaches the broker
// before the previous one was acknowledged, whatever the broker does with
// each message (refuse one record, fail one ack, reorder a retry). A row
// that failed in prepare blocks its aggregate in its own turn. The round
// trips per batch are the most rows one aggregate has in it: one, unless
// a backlog piled up behind one aggregate. It returns how many Publish
// calls it made. When receipts is not nil, it sets receipts[i] for each
// row the broker took.
func (f *Forwarder) publishWaves(ctx context.Context, claimed []row, msgs []Outgoing, results []error, receipts []Receipt) int {
	keys := make([]string, len(claimed))
	for i, r := range claimed {
		keys[i] = r.aggregateType + "\x00" + r.aggregateID
	}
	return waves(ctx, keys, msgs, results, receipts, f.publish, func(m Outgoing) {
		f.cfg.Logger.Error("broker audit: the Auditor acknowledged a message without a receipt (see brokertest.RunAudit)",
			"message_id", m.Message.UUID)
	})
}

// PublishWaves publishes msgs through b in the forwarder's waves (see
// docs/forwarder.md): wave k holds the k-th message of each aggregate, keys[i]
// naming msgs[i]'s aggregate, one Publish call per wave, and an aggregate
// whose message failed has its later messages held ([ErrHeld]). results[i]
// is nil when msgs[i] was acknowledged; a results[i] already set on entry
// is a message that failed before the broker (it blocks its aggregate in
// its turn and is not sent). It returns how many Publish calls it made. The
// WAL relay (package walrelay) publishes with it, so both modes keep one
// ordering rule.
func PublishWaves(ctx context.Context, b Broker, keys []string, msgs []Outgoing, results []error) int {
	return waves(ctx, keys, msgs, results, nil, func(ctx context.Context, wave []Outgoing) ([]Receipt, []error) {
		return nil, b.Publish(ctx, wave)
	}, nil)
}

// PublishWavesReceipts is [PublishWaves] through an Auditor's
// PublishReceipts: receipts[i] (len(msgs) of them) is where the broker put
// msgs[i] when results[i] is nil. A message acknowledged without a receipt
// counts as not sent ([ErrBrokerUnavailable]): sent again rather than left
// unaudited; noReceipt (may be nil) is told, to say loudly that the
// Auditor is broken. The WAL relay keeps its receipts with it.
func PublishWavesReceipts(ctx context.Context, a Auditor, keys []string, msgs []Outgoing, results []error, receipts []Receipt,
	noReceipt func(Outgoing)) int {
	return waves(ctx, keys, msgs, results, receipts, a.PublishReceipts, noReceipt)
}

// waves is publishWaves and PublishWaves: publish sends one wave;
// noReceipt is told of a message acknowledged without the receipt
// receipts (when not nil) asked for.
func waves(ctx context.Context, keys []string, msgs []Outgoing, results []error, receipts []Receipt,
	publish func(context.Context, []Outgoing) ([]Receipt, []error), noReceipt func(Outgoing)) int {
	pending := make([]int, len(msgs))
	for i := range msgs {
		pending[i] = i
	}
	blocked := make(map[string]bool)
	inWave := make(map[string]bool, len(msgs))
	wave := make([]Outgoing, 0, len(msgs))
	index := make([]int, 0, len(msgs)) // wave[j] is msgs[index[j]]
	calls := 0
	for len(pending) > 0 {
		clear(inWave)
		wave, index = wave[:0], index[:0]
		rest := pending[:0] // filtered in place: writes never pass reads
		for _, i := range pending {
			k := keys[i]
			switch {
			case blocked[k]:
				results[i] = errHeld
			case inWave[k]:
				rest = append(rest, i) // a later wave
			case results[i] != nil:
				blocked[k] = true // failed in prepare: its turn, and its aggregate stops here
			default:
				inWave[k] = true
				wave = append(wave, msgs[i])
				index = append(index, i)
			}
		}
		pending = rest
		if len(wave) == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			// PublishTimeout covers the whole batch: a wave whose turn
			// comes after it is not sent (a broker would only start
			// sends it must then abandon), and its aggregates stop.
			for _, i := range index {
				results[i] = fmt.Errorf("%w: publish timeout passed before this row's turn: %w", ErrBrokerUnavailable, context.Cause(ctx))
				blocked[keys[i]] = true
			}
			continue
		}
		calls++
		rs, errs := publish(ctx, wave)
		for j, i := range index {
			var err error
			switch {
			case j >= len(errs):
				err = fmt.Errorf("%w: the broker returned %d results for %d messages", ErrBrokerUnavailable, len(errs), len(wave))
			case errs[j] != nil:
				err = errs[j]
			case receipts == nil:
			case j >= len(rs) || rs[j].BrokerTopic == "" || rs[j].Position == "":
				// Published, but with nothing to audit it by: sent again
				// rather than left unaudited (consumers deduplicate). A
				// broker that never gives one is broken: said loudly.
				err = fmt.Errorf("%w: the broker returned no receipt for a message it acknowledged", ErrBrokerUnavailable)
				if noReceipt != nil {
					noReceipt(wave[j])
				}
			default:
				receipts[i] = rs[j]
			}
			results[i] = err
			if err != nil {
				blocked[keys[i]] = true
			}
		}
	}
	return calls
}

// ErrHeld marks a message not sent because an earlier message of its
// aggregate failed in the same batch; it costs the row no attempt.
var ErrHeld = errors.New("held behind an earlier row of its aggregate")

var errHeld = ErrHeld

func (f *Forwarder) message(r row) (*message.Message, error) {
	return Message(Row{
		MessageID: r.messageID, AggregateType: r.aggregateType, AggregateID: r.aggregateID,
		AggregateVersion: r.version, EventType: r.eventType, Payload: r.payload, Metadata: r.metadata,
		OccurredAt: r.occurredAt, DiscardedAt: r.discardedAt,
	})
}

type marks struct {
	// The receipts of the published rows, when the broker is audited:
	// those of rows read from outbox_failures go with the batch (inTx),
	// the others wait for the lease tick that records the cursor past
	// them (deferred; see pendingReceipts).
	inTx, deferred receiptSet
	// settled are rows of outbox_failures now published: they leave it.
	settled []int64
	// failed rows, to record (or update) in outbox_failures.
	failedIDs          []int64
	failedTypes        []string
	failedAggs         []string
	failedAttempts     []int
	failedErr          []string
	failedDue          []time.Time
	parkNow            []bool
	heldIDs            []int64
	heldTypes, heldAgg []string
	// done: the new rows (read above the highs) published or moved to
	// outbox_failures. unsent: per partition, the lowest id of a new row
	// not sent (a broker outage): the cursor reads it again. lateUnsent:
	// the tracked transactions with a late row in that case.
	done       []int64
	unsent     map[int32]int64
	lateUnsent map[string]bool
}

// classify turns per-row results into marks. A broker outage leaves a row
// as it was (the cursor reads it again, or it stays due in
// outbox_failures); a row held behind an earlier one of its aggregate
// joins it in outbox_failures; a row's own failure counts an attempt,
// schedules a retry with jittered exponential backoff, or parks it.
func (f *Forwarder) classify(claimed []row, results []error, receipts []Receipt, res *batchResult) marks {
	m := marks{unsent: map[int32]int64{}, lateUnsent: map[string]bool{}}
	now := time.Now()
	for i, r := range claimed {
		err := results[i]
		switch {
		case err == nil:
			if r.failure != "" {
				m.settled = append(m.settled, r.id)
			} else if r.late == "" {
				m.done = append(m.done, r.id)
			}
			switch {
			case receipts == nil:
			case r.failure != "":
				m.inTx.add(r.id, receipts[i])
			default:
				m.deferred.add(r.id, receipts[i])
			}
			res.published++
			res.countTopic(r.topic, 0)
		case errors.Is(err, errHeld):
			res.held++
			if r.failure == "" {
				if r.late == "" {
					m.done = append(m.done, r.id)
				}
				m.heldIDs = append(m.heldIDs, r.id)
				m.heldTypes = append(m.heldTypes, r.aggregateType)
				m.heldAgg = append(m.heldAgg, r.aggregateID)
			}
		case errors.Is(err, ErrBrokerUnavailable):
			if res.unavailable == nil {
				res.unavailable = err
			}
			switch {
			case r.failure != "":
			case r.late != "":
				m.lateUnsent[r.late] = true
			default:
				if u, ok := m.unsent[r.partition]; !ok || r.id < u {
					m.unsent[r.partition] = r.id
				}
			}
		default:
			attempt := r.attempts + 1
			// A row too large for the limit is parked at once: no retry makes it
			// fit; the operator raises the limit or fixes the row, then retries.
			park := attempt >= f.cfg.MaxAttempts || errors.Is(err, ErrTooLarge)
			if r.failure == "" && r.late == "" {
				m.done = append(m.done, r.id)
			}
			m.failedIDs = append(m.failedIDs, r.id)
			m.failedTypes = append(m.failedTypes, r.aggregateType)
			m.failedAggs = append(m.failedAggs, r.aggregateID)
			m.failedAttempts = append(m.failedAttempts, attempt)
			m.failedErr = append(m.failedErr, truncate(err.Error(), maxErrorBytes))
			m.failedDue = append(m.failedDue, now.Add(f.retryDelay(attempt)))
			m.parkNow = append(m.parkNow, park)
			res.countTopic(r.topic, 1)
			if park {
				res.parked++
				res.countTopic(r.topic, 2)
				f.cfg.Logger.With(r.logArgs()...).Warn("outbox row parked", "outbox_id", r.id, "message_id", r.messageID,
					"aggregate_id", r.aggregateID, "attempts", attempt, "error", err.Error())
			} else {
				res.failed++
			}
		}
	}
	return m
}

func (f *Forwarder) retryDelay(attempt int) time.Duration {
	return backoff.Delay(f.cfg.RetryBackoff, f.cfg.RetryBackoffMax, attempt)
}

// mark records, in the claim's transaction, what the batch changed off
// the normal path (nothing for a row simply published): the rows of
// outbox_failures published leave it, with their receipts for the audit,
// and failed and held rows enter it.
func (f *Forwarder) mark(ctx context.Context, tx pgx.Tx, m marks) error {
	b := &pgx.Batch{}
	if len(m.settled) > 0 {
		b.Queue(`DELETE FROM outbox_failures WHERE id = ANY($1)`, m.settled)
	}
	if len(m.failedIDs) > 0 {
		b.Queue(`
			INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, last_error, next_attempt_at, parked_at)
			SELECT f.id, f.at, f.aid, 'failed', f.attempts, f.err, f.due, CASE WHEN f.park THEN now() END
			FROM unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::text[], $6::timestamptz[], $7::bool[])
			     AS f(id, at, aid, attempts, err, due, park)
			ON CONFLICT (id) DO UPDATE SET kind = 'failed', attempts = excluded.attempts, last_error = excluded.last_error,
			       next_attempt_at = excluded.next_attempt_at, parked_at = excluded.parked_at`,
			m.failedIDs, m.failedTypes, m.failedAggs, m.failedAttempts, m.failedErr, m.failedDue, m.parkNow)
	}
	if len(m.heldIDs) > 0 {
		b.Queue(`
			INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind)
			SELECT id, at, aid, 'held' FROM unnest($1::bigint[], $2::text[], $3::text[]) AS h(id, at, aid)
			ON CONFLICT (id) DO NOTHING`, m.heldIDs, m.heldTypes, m.heldAgg)
	}
	// In the claim's transaction: the rows of outbox_failures leave it
	// with this commit, and no cursor would publish them again.
	m.inTx.queue(b)
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("mark outbox batch: %w", err)
	}
	return nil
}
