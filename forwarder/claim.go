package forwarder

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/backoff"
)

// partitionExpr maps a row to its partition. hashtextextended is stable
// within a PostgreSQL major version, which is all a lease needs: rows are
// not stored by partition, they are only assigned at claim time.
const partitionExpr = `((hashtextextended(o.aggregate_id, 0) % $2) + $2) % $2`

// claimSQL takes the oldest claimable rows of the partitions this instance
// leases. FOR UPDATE, not SKIP LOCKED: a partition has one owner, so a
// locked row means a previous owner that lost its lease is still finishing
// its batch, and skipping it would publish that aggregate's later events
// first. Waiting (bounded by lock_timeout) keeps the order.
//
// A row is claimable unless an earlier row of its aggregate is parked or
// waiting for its retry: those hold the aggregate's later rows back.
//
// The candidates come from two places, each in id order: the pending-rows
// index above the low-water mark $4 (rows never tried), and the small
// blocked-rows index (rows whose retry is due, wherever they are: the mark
// may have passed them). The first $1 of their union is the first $1 of all
// claimable rows. The outer query locks and rechecks the row's state, so a
// row a previous owner published while this claim waited drops out.
//
// The lease check is part of the claim: the partitions this instance leases
// are locked FOR SHARE for the whole transaction, which fences takeover:
// another instance cannot take a partition while this transaction, which
// publishes its rows, is open.
const claimSQL = `
WITH mine AS MATERIALIZED (
    SELECT partition FROM outbox_partitions
    WHERE owner = $3 AND lease_until > now()
    FOR SHARE
)
SELECT t.id, t.message_id::text, t.topic, t.aggregate_type, t.aggregate_id, t.aggregate_version,
       t.event_type, t.payload::text, t.metadata::text, t.occurred_at, t.attempts, t.discarded_at
FROM outbox t
WHERE t.published_at IS NULL AND t.parked_at IS NULL
  AND (t.next_attempt_at IS NULL OR t.next_attempt_at <= now())
  AND t.id IN (
    (SELECT o.id FROM outbox o
     WHERE o.published_at IS NULL AND o.id > $4 AND o.parked_at IS NULL AND o.next_attempt_at IS NULL
       AND ` + mineAndFree + `
     ORDER BY o.id LIMIT $1)
    UNION ALL
    (SELECT o.id FROM outbox o
     WHERE o.published_at IS NULL AND o.parked_at IS NULL AND o.next_attempt_at <= now()
       AND ` + mineAndFree + `
     ORDER BY o.id LIMIT $1))
ORDER BY t.id
LIMIT $1
FOR UPDATE OF t`

// mineAndFree: o is in a partition this instance leases and no earlier row
// of its aggregate is parked or waiting for its retry.
const mineAndFree = `((SELECT count(*) FROM mine) = $2 OR ` + partitionExpr + ` = ANY(ARRAY(SELECT partition FROM mine)))
       AND NOT EXISTS (
           SELECT 1 FROM outbox b
           WHERE b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id AND b.id < o.id
             AND b.published_at IS NULL AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL))`

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

// forwardBatch claims a batch in one transaction, publishes it, marks what
// the broker acknowledged and commits. The transaction stays open during the
// publish on purpose: its row locks are the claim, so a crash at any point
// rolls the claim back and the rows are forwarded again (a duplicate, never
// a loss).
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

	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(f.cfg.ClaimLockTimeout.Milliseconds(), 10))
	// The marks need not wait for their WAL flush: if PostgreSQL crashes and
	// loses them, the rows are published again (a duplicate, which
	// consumers absorb), never lost. The broker already has them.
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	lw := f.low.queue(b, start, f.cfg.FullClaimInterval)
	var claimed []row
	b.Queue(claimSQL, f.cfg.BatchSize, f.cfg.Partitions, f.cfg.InstanceID, lw.from).Query(func(rows pgx.Rows) error {
		var err error
		claimed, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.id, &x.messageID, &x.topic, &x.aggregateType, &x.aggregateID, &x.version,
				&x.eventType, &x.payload, &x.metadata, &x.occurredAt, &x.attempts, &x.discardedAt)
			return x, err
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return res, fmt.Errorf("claim outbox batch: %w", err)
	}
	f.low.apply(lw, start, len(claimed))
	res.claimed = len(claimed)
	if len(claimed) == 0 {
		return res, tx.Commit(ctx)
	}

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
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.ShutdownTimeout)
	defer mcancel()
	if err := f.mark(mctx, tx, marks); err != nil {
		return res, err
	}
	if err := tx.Commit(mctx); err != nil {
		return res, fmt.Errorf("commit outbox batch: %w", err)
	}
	f.metrics.batchSeconds.Observe(time.Since(start).Seconds())
	for topic, c := range res.byTopic {
		f.metrics.forwarded.WithLabelValues(topic).Add(float64(c[0]))
		f.metrics.failedAttempts.WithLabelValues(topic).Add(float64(c[1]))
		f.metrics.parked.WithLabelValues(topic).Add(float64(c[2]))
	}
	return res, nil
}

// prepare builds the broker messages. A row that cannot be turned into a
// message (or cannot fit the broker) gets its error here, without being
// sent; msgs[i] is claimed[i]'s message when results[i] is nil.
func (f *Forwarder) prepare(claimed []row) ([]Outgoing, []error) {
	results := make([]error, len(claimed))
	msgs := make([]Outgoing, len(claimed))
	lim := f.brokerLimit()
	for i, r := range claimed {
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

// PublishWaves publishes msgs through b in the forwarder's waves (see the
// package doc): wave k holds the k-th message of each aggregate, keys[i]
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
	published []int64
	// receipts, parallel to published when the broker is audited.
	brokerTopics, positions []string
	failedIDs               []int64
	failedErr               []string
	failedDue               []time.Time
	parkNow                 []bool
}

// classify turns per-row results into marks. Broker outages and held rows
// leave rows untouched; a row's own failure counts an attempt, schedules a
// retry with jittered exponential backoff, or parks it.
func (f *Forwarder) classify(claimed []row, results []error, receipts []Receipt, res *batchResult) marks {
	var m marks
	now := time.Now()
	for i, r := range claimed {
		err := results[i]
		switch {
		case err == nil:
			m.published = append(m.published, r.id)
			if receipts != nil {
				m.brokerTopics = append(m.brokerTopics, receipts[i].BrokerTopic)
				m.positions = append(m.positions, receipts[i].Position)
			}
			res.published++
			res.countTopic(r.topic, 0)
		case errors.Is(err, errHeld):
			res.held++
		case errors.Is(err, ErrBrokerUnavailable):
			if res.unavailable == nil {
				res.unavailable = err
			}
		default:
			attempt := r.attempts + 1
			// A row too large for the limit is parked at once: no retry makes it
			// fit; the operator raises the limit or fixes the row, then retries.
			park := attempt >= f.cfg.MaxAttempts || errors.Is(err, ErrTooLarge)
			m.failedIDs = append(m.failedIDs, r.id)
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

func (f *Forwarder) mark(ctx context.Context, tx pgx.Tx, m marks) error {
	b := &pgx.Batch{}
	if len(m.published) > 0 {
		b.Queue(`UPDATE outbox SET published_at = now() WHERE id = ANY($1)`, m.published)
		// Any one of our partitions carries the count; their sum is the total.
		b.Queue(`UPDATE outbox_partitions SET published_total = published_total + $1
			WHERE partition = (SELECT min(partition) FROM outbox_partitions WHERE owner = $2)`,
			len(m.published), f.cfg.InstanceID)
		if m.positions != nil {
			// In the mark's transaction: a row is published with its
			// receipt or not at all, so the audit checks every row the
			// broker took, whenever the batch commits.
			b.Queue(`INSERT INTO outbox_receipts (outbox_ids, broker_topics, positions) VALUES ($1, $2, $3)`,
				m.published, m.brokerTopics, m.positions)
		}
	}
	if len(m.failedIDs) > 0 {
		b.Queue(`
			UPDATE outbox o SET attempts = o.attempts + 1, last_error = f.err,
			       next_attempt_at = f.due, parked_at = CASE WHEN f.park THEN now() END
			FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::bool[]) AS f(id, err, due, park)
			WHERE o.id = f.id`, m.failedIDs, m.failedErr, m.failedDue, m.parkNow)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("mark outbox batch: %w", err)
	}
	return nil
}
