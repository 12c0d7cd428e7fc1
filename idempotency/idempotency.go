package idempotency

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/configcheck"
)

// Ordering says how a consumer treats aggregate versions.
type Ordering int

const (
	// Strict applies each aggregate's versions one by one, in order.
	Strict Ordering = iota
	// LatestWins applies a version newer than the last applied one and
	// skips older ones: for projections that only need the latest state.
	LatestWins
)

// Config configures one consumer.
type Config struct {
	// Pool is the consumer's database. Required.
	Pool *pgxpool.Pool
	// Consumer names the consumer: deduplication is per (message, consumer).
	// Required.
	Consumer string
	// Ordering defaults to Strict.
	Ordering Ordering
	// GapRetryDelay is how often a message that arrived ahead of its
	// predecessor (held in dead_letters) is tried again. Defaults to 1s.
	GapRetryDelay time.Duration
	// GapTimeout is how long a gap may stay open before the waiting message
	// is marked dead and reported. Defaults to 5m.
	GapTimeout time.Duration
	// MaxAttempts is how many times a failing message is tried before it is
	// dead. Defaults to 8.
	MaxAttempts int
	// RetryBackoff is the delay before the first retry; it doubles per
	// attempt, with jitter, up to RetryBackoffMax. Defaults to 1s and 5m.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// RetryPollInterval is how often Run looks for retries that are due,
	// and so how long a held message may wait once its predecessor is in.
	// Defaults to 100ms.
	RetryPollInterval time.Duration
	// MaxBatch is how many messages handled at the same time may share one
	// transaction. Defaults to 100; 1 gives every message a transaction of
	// its own.
	MaxBatch int
	// BaselineBefore lets a consumer added after the streams were trimmed
	// start (Strict only; zero, the default, is off). For an aggregate it
	// has applied nothing of, the first event it handles becomes the
	// aggregate's baseline, applied whatever its version, when that event
	// occurred before BaselineBefore; and a later event whose predecessors
	// do not arrive within GapTimeout becomes the baseline then, instead of
	// dead. Set it to the time the consumer is first deployed. The price:
	// an aggregate's version before its baseline is skipped as stale if it
	// arrives after it, and an aggregate created after BaselineBefore that
	// never receives its version 1 starts at its first version after
	// GapTimeout. An aggregate a reset made the consumer forget
	// (replay.ResetConsumer) never takes a baseline: its history starts
	// again at version 1. See docs/idempotency.md.
	BaselineBefore time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, when set, is where the consumer registers its counters
	// (outflow_consumer_*, see metrics.go), labelled Consumer and Topic.
	// Consumers of one process share the collectors. Nil: no metrics.
	Metrics prometheus.Registerer
	// Topic labels the consumer's metrics: the topic it reads.
	Topic string
}

func (c *Config) setDefaults() {
	c.GapRetryDelay = cmp.Or(c.GapRetryDelay, time.Second)
	c.GapTimeout = cmp.Or(c.GapTimeout, 5*time.Minute)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, backoff.RetryBase)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, backoff.RetryMax)
	c.RetryPollInterval = cmp.Or(c.RetryPollInterval, 100*time.Millisecond)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 8)
	c.MaxBatch = cmp.Or(c.MaxBatch, 100)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Pool != nil, "Pool", "is required")
	check(c.Consumer != "", "Consumer", "is required")
	check(c.GapRetryDelay >= 0 && c.GapTimeout >= c.GapRetryDelay, "GapRetryDelay", "must be positive and at most GapTimeout")
	check(c.MaxAttempts >= 1, "MaxAttempts", "must be at least 1")
	check(c.RetryBackoff > 0 && c.RetryBackoffMax >= c.RetryBackoff, "RetryBackoff", "must be positive and at most RetryBackoffMax")
	check(c.RetryPollInterval > 0, "RetryPollInterval", "must be positive")
	check(c.MaxBatch >= 1, "MaxBatch", "must be at least 1")
	return errs.Err("idempotency config")
}

type txKey struct{}

type queueKey struct{}

// QueueExec queues a statement into the transaction of the message being
// handled, to be sent with every other queued statement of the transaction
// in one round trip, just before the commit. It is for blind writes (an
// upsert of a counter, an insert) whose results the handler does not read:
// in a shared transaction, the statements run after every handler of the
// batch has returned. An error from one of them fails the transaction like
// a handler error. It returns an error when ctx is not a handled message's.
func QueueExec(ctx context.Context, sql string, args ...any) error {
	q, ok := ctx.Value(queueKey{}).(*pgx.Batch)
	if !ok {
		return errors.New("idempotency: QueueExec outside a handled message")
	}
	q.Queue(sql, args...)
	return nil
}

// withTx gives a handler's message context its transaction and queue.
func withTx(ctx context.Context, tx pgx.Tx, q *pgx.Batch) context.Context {
	return context.WithValue(context.WithValue(ctx, txKey{}, tx), queueKey{}, q)
}

// sendQueued sends what the handlers queued.
func sendQueued(ctx context.Context, tx pgx.Tx, q *pgx.Batch) error {
	if q.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, q).Close(); err != nil {
		return fmt.Errorf("idempotency: queued statements: %w", err)
	}
	return nil
}

// Tx returns the transaction the consumer opened for the message being
// handled. Write the handler's effects in it: they commit with the
// aggregate's new version, or not at all.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Consumer makes one handler idempotent and ordered. Use its Middleware on
// the handler, and Run it for the retries.
type Consumer struct {
	cfg Config

	mu      sync.Mutex
	handler message.HandlerFunc // the wrapped handler, for retries

	batch batcher

	// wake ends Run's wait for its next round: a commit that left a held
	// event due (its predecessor applied, the event not) sends to it, so
	// the event does not wait for RetryPollInterval. Buffered: a send while
	// a round runs is kept for the round after, never lost.
	wake chan struct{}
	// rounds counts the retry rounds run, for tests that must know Run is
	// waiting.
	rounds atomic.Int64

	metrics *metrics
}

// NewConsumer validates cfg.
func NewConsumer(cfg Config) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Metrics, cfg.Consumer, cfg.Topic)
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, metrics: m, wake: make(chan struct{}, 1)}, nil
}

// wakeRetries has Run start a round now. Call it after the commit that
// made a dead letter due, never before: a round woken earlier would read
// the dead letters before the commit, find nothing due, and take the wake
// with it.
func (c *Consumer) wakeRetries() {
	select {
	case c.wake <- struct{}{}:
	default: // a wake is pending: the round it starts reads after this commit
	}
}

// Name returns the consumer's name.
func (c *Consumer) Name() string { return c.cfg.Consumer }

// outcome is what the consumer decided for one message.
type outcome int

const (
	applied outcome = iota
	duplicate
	stale
	gap
	held
)

func (o outcome) String() string {
	return [...]string{"applied", "duplicate", "stale", "gap", "held"}[o]
}

// claimSQL checks the message's version and records it in one statement:
// the aggregate's row in consumer_aggregate_versions is the consumer's only
// bookkeeping. An aggregate has one event per version, so a message at the
// stored version is a duplicate and one below it is stale, however old: no
// row per message is needed to recognise a redelivery. The one case the
// version cannot tell is a redelivery of a message dead-lettered for a retry (its
// version may be exactly the next one): $7 (a delivery, not a retry) has
// the statement look for the message's open dead letter by the
// (consumer, message_id) key, a read that writes nothing.
//
// The update (or, for an aggregate's first message, the insert) locks the
// aggregate's row for the transaction, so deliveries of one aggregate
// serialize, and sets the new version only when the message applies: a
// duplicate, a gap or a held message leaves it as it was, so a batch can
// keep the statement's effects for the messages it does not apply. An
// aggregate with an open dead letter below the message's version applies
// nothing: its later events queue behind it. That check, consumer_blocked,
// takes a snapshot of its own (a volatile function does) and is evaluated
// again once the row lock is had: an UPDATE that waited for the row
// re-evaluates its SET on the row the previous holder committed (every
// claim writes the row, so a holder always leaves a new version), as the
// ON CONFLICT's DO UPDATE evaluates it after taking the lock. A subquery of
// this statement would read the snapshot taken before the wait and miss a
// dead letter that the lock's previous holder committed.
// (The dead-letter read may miss a dead letter committed during that wait:
// the message then runs once more out of its backoff, and its dead letter, at
// or below the version by then, is settled as a duplicate: no second
// effect.)
// $8 says the message may be its aggregate's baseline: it applies whatever
// its version when the consumer has applied nothing of the aggregate
// (version 0), unless a reset made the consumer forget the aggregate
// (reset_at, see replay.ResetConsumer): then its history starts again at
// version 1, which the replay brings, and a later version taken as the
// baseline would make the replayed ones stale. The statement returns
// whether the aggregate is so marked; the outcome is read by classify.
//
// The row is updated in place: no indexed column changes, and the table's
// fillfactor (migration 00026) leaves room on its page, so the update is
// HOT and writes no index entry.
const claimSQL = `
WITH fresh AS (
    SELECT NOT ($7 AND EXISTS (
        SELECT 1 FROM dead_letters d
        WHERE d.consumer = $2 AND d.message_id = $1::uuid AND d.status IN ('retrying', 'dead', 'held'))) AS f
), u AS (
    UPDATE consumer_aggregate_versions c SET ` + claimSet + `
    WHERE c.consumer = $2 AND c.aggregate_type = $3 AND c.aggregate_id = $4
    RETURNING c.prev_version, c.version, c.reset_at IS NOT NULL AS reset
), i AS (
    INSERT INTO consumer_aggregate_versions AS c (consumer, aggregate_type, aggregate_id, version, prev_version)
    SELECT $2, $3, $4, CASE WHEN (SELECT f FROM fresh) AND (($6 AND ($5 = 1 OR $8)) OR (NOT $6 AND $5 > 0))
                             AND NOT consumer_blocked($2, $3, $4, $5) THEN $5 ELSE 0 END, 0
    WHERE NOT EXISTS (SELECT 1 FROM u)
    ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET ` + claimSet + `
    RETURNING c.prev_version, c.version, c.reset_at IS NOT NULL AS reset
)
SELECT (SELECT f FROM fresh), prev_version, version, reset FROM (SELECT * FROM u UNION ALL SELECT * FROM i) v`

// claimSet is the claim's update of an aggregate's row c: the new version
// when the message applies, the old one kept otherwise. The same in the
// UPDATE and in the INSERT's ON CONFLICT, which only an aggregate's first
// message reaches (its row inserted by a concurrent transaction after the
// UPDATE's snapshot). The UPDATE comes first because a row that exists is
// the common case: a plain UPDATE writes one heap-only tuple, where ON
// CONFLICT DO UPDATE also writes a row-lock record before it (54 bytes of
// WAL an event).
const claimSet = `
        prev_version = c.version,
        version = CASE WHEN (SELECT f FROM fresh)
                            AND (($6 AND ($5 = c.version + 1 OR (c.version = 0 AND $8 AND c.reset_at IS NULL)))
                                 OR (NOT $6 AND $5 > c.version))
                            AND NOT consumer_blocked($2, $3, $4, $5)
                       THEN $5 ELSE c.version END,
        updated_at = now()`

// Middleware is the Watermill handler middleware. One Consumer wraps one
// handler. Messages handled concurrently (a subscriber that delivers a
// batch at once, several subscribers feeding one handler) share
// transactions, up to MaxBatch per transaction; see docs/idempotency.md.
func (c *Consumer) Middleware(h message.HandlerFunc) message.HandlerFunc {
	// Swapped here, once, so that every path (alone, in a batch, a retry of
	// a held one) sees the same handler.
	h = skippingDiscardMarkers(h)
	c.mu.Lock()
	c.handler = h
	c.mu.Unlock()
	return func(msg *message.Message) ([]*message.Message, error) {
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			// No aggregate to order by and nothing a retry would fix.
			c.cfg.Logger.Error("message without a valid envelope acknowledged and dropped", "consumer", c.cfg.Consumer,
				"message_id", msg.UUID, "error", err.Error())
			return nil, nil
		}
		if c.cfg.MaxBatch > 1 {
			return c.batch.do(c, h, msg, env)
		}
		return c.handleOne(h, msg, env)
	}
}

// skippingDiscardMarkers runs h on every message but a discard marker (see
// [events.EventTypeDiscarded]), which the operator chose to drop: for a
// marker it does nothing. The marker still goes through the bookkeeping
// like any event (its version applied in order, held when early), which is what lets the aggregate's later events flow.
func skippingDiscardMarkers(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if events.IsDiscardMarker(msg) {
			return nil, nil
		}
		return h(msg)
	}
}

// handleOne runs one message in a transaction of its own.
func (c *Consumer) handleOne(h message.HandlerFunc, msg *message.Message, env events.Envelope) ([]*message.Message, error) {
	ctx := msg.Context()
	// The transaction's own statements (the bookkeeping, the queued
	// statements, the commit) outlive the message's context: a deadline set
	// around the handler (Watermill's Timeout middleware) bounds the
	// handler's work, not the commit of what it already did. A handler that
	// returns nil after its deadline has its effects committed, once.
	start := time.Now()
	out, v, err := c.apply(context.WithoutCancel(ctx), ctx, c.cfg.Pool, h, msg, env, true, c.mayBaseline(env), true)
	o := v.outcome
	switch {
	case err != nil:
		// The handler failed: dead-letter the message for a retry, so that
		// other aggregates keep flowing, and acknowledge it.
		status := c.failedStatus(err)
		if derr := c.deadLetter(ctx, msg, env, status, "handler failed", err.Error()); derr != nil {
			return nil, errors.Join(err, derr) // nacked: the broker redelivers
		}
		c.metrics.failed(status)
		c.cfg.Logger.With(env.LogArgs()...).Warn("handler failed; retry scheduled", "consumer", c.cfg.Consumer, "message_id", env.MessageID,
			"aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion, "error", err.Error())
		return nil, nil
	case o == gap || o == held:
		// Held in the database, not in the stream: the stream keeps
		// flowing (the predecessor may be behind this very message), and
		// Run applies it once the predecessor is in.
		reason, text := holdReason(o, env)
		if err := c.deadLetter(ctx, msg, env, "held", reason, text); err != nil {
			return nil, err
		}
		c.metrics.count(o, 0)
		return nil, nil
	}
	c.metrics.count(o, time.Since(start))
	c.countHeld(v.chain)
	if v.chain.leftDue {
		c.wakeRetries()
	}
	return out, nil
}

// failedStatus is the status a message whose handler failed with err is
// dead-lettered with: retrying, or dead at once when MaxAttempts is 1.
func (c *Consumer) failedStatus(err error) string {
	if c.cfg.MaxAttempts <= 1 && !waitsForDeploy(err) {
		return "dead"
	}
	return "retrying"
}

// waitsForDeploy reports whether a handler's err says that the message is
// fine but this build cannot read it yet: a payload of a schema version newer
// than the consumer's registry knows (events.ErrUnknownVersion), which its
// producer, deployed first, wrote. Such a message is retried, at
// RetryBackoffMax at most, however many attempts it takes, and never marked
// dead: it applies once the consumer is deployed with the new version, and
// its aggregate's later events wait behind it meanwhile rather than apply
// out of order. Counting it towards MaxAttempts would turn a deployment
// order into dead letters for an operator.
func waitsForDeploy(err error) bool {
	return errors.Is(err, events.ErrUnknownVersion)
}

// holdReason is the reason and text a held message is dead-lettered with. The
// text says what is known when it is written, and stays true: the version
// before had not been applied. Not that it had not arrived: it may have,
// and be waiting in dead_letters itself (failed, or dead), which the
// bookkeeping does not tell apart; the console reads which it is when it
// shows the held message.
func holdReason(o outcome, env events.Envelope) (reason, text string) {
	if o == gap {
		return "gap", fmt.Sprintf("version %d arrived before version %d was applied", env.AggregateVersion, env.AggregateVersion-1)
	}
	return "behind an earlier event of its aggregate", ""
}

// mayBaseline says whether env may become its aggregate's baseline: it
// occurred before Config.BaselineBefore.
func (c *Consumer) mayBaseline(env events.Envelope) bool {
	return !c.cfg.BaselineBefore.IsZero() && env.OccurredAt.Before(c.cfg.BaselineBefore)
}

// queueClaim queues the bookkeeping of one message.
func (c *Consumer) queueClaim(q *pgx.Batch, env events.Envelope, fresh, baseline bool) {
	q.Queue(claimSQL, env.MessageID, c.cfg.Consumer, env.AggregateType, env.AggregateID,
		env.AggregateVersion, c.cfg.Ordering == Strict, fresh, baseline)
}

// verdict is the bookkeeping's decision on one message.
type verdict struct {
	outcome
	// afterReset says that a reset made the consumer forget the aggregate
	// and it has applied nothing since: it waits for its version 1 and
	// takes no baseline (see endGap).
	afterReset bool
	// chain is what the held events right behind the message did, applied
	// in its transaction (see applyHeld).
	chain heldOutcome
}

// readClaim reads the result of what queueClaim queued.
func (c *Consumer) readClaim(res pgx.BatchResults, env events.Envelope, baseline bool) (verdict, error) {
	v, _, err := c.readClaimVersion(res, env, baseline)
	return v, err
}

// readClaimVersion is readClaim that also returns the aggregate's version
// after the claim.
func (c *Consumer) readClaimVersion(res pgx.BatchResults, env events.Envelope, baseline bool) (verdict, int64, error) {
	var (
		isNew, reset bool
		prev, stored int64
	)
	if err := res.QueryRow().Scan(&isNew, &prev, &stored, &reset); err != nil {
		return verdict{}, 0, err
	}
	return decide(isNew, c.cfg.Ordering == Strict, baseline, reset, prev, stored, env.AggregateVersion), stored, nil
}

// decide reads the claim statement's result as classify does, reset
// saying whether the aggregate's row is marked reset. The statement
// refuses the baseline of a reset aggregate: classify must not count on
// it either, or it would read the refusal as a message blocked by a dead
// letter.
func decide(fresh, strict, baseline, reset bool, prev, stored, version int64) verdict {
	return verdict{
		outcome:    classify(fresh, strict, baseline && !reset, prev, stored, version),
		afterReset: reset && stored == 0,
	}
}

// beginner opens a transaction: the pool, or a transaction that nests a
// savepoint in itself.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// apply runs h on msg in a transaction with the bookkeeping, begun on db
// with ctx; h gets hctx, the transaction in it. fresh says whether the
// message is a delivery, which is a duplicate if it is a dead letter (false
// for a retry, which runs the dead letter itself); baseline whether it may become
// its aggregate's baseline; follow whether the held events right behind it
// apply in its transaction once it applied (applyHeld).
func (c *Consumer) apply(ctx, hctx context.Context, db beginner, h message.HandlerFunc, msg *message.Message, env events.Envelope, fresh, baseline, follow bool) ([]*message.Message, verdict, error) {
	var (
		out []*message.Message
		o   verdict
	)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var claim pgx.Batch
		c.queueClaim(&claim, env, fresh, baseline)
		if follow {
			c.queueHeldBehind(&claim, env)
		}
		res := tx.SendBatch(ctx, &claim)
		var (
			err    error
			behind []heldRow
		)
		o, err = c.readClaim(res, env, baseline)
		if err == nil && follow {
			behind, err = readHeldBehind(res)
		}
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("idempotency: record message: %w", err)
		}
		switch o.outcome {
		case duplicate, stale, gap, held:
			return errRollback // nothing to keep: the version row is as it was
		}
		var q pgx.Batch
		msg.SetContext(withTx(hctx, tx, &q))
		defer msg.SetContext(hctx)
		if out, err = h(msg); err != nil {
			return err
		}
		if err := sendQueued(ctx, tx, &q); err != nil {
			return err
		}
		if len(behind) == 0 {
			return nil
		}
		o.chain, err = c.applyHeld(ctx, tx, h, behind, map[aggKey]int64{{env.AggregateType, env.AggregateID}: env.AggregateVersion})
		return err
	})
	if err != nil {
		o.chain = heldOutcome{}
	}
	if errors.Is(err, errRollback) {
		err = nil
	}
	if err == nil && (o.outcome == duplicate || o.outcome == stale) {
		c.cfg.Logger.Debug("message skipped", "consumer", c.cfg.Consumer, "message_id", env.MessageID,
			"aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion, "outcome", o.String())
	}
	return out, o, err
}

var errRollback = errors.New("rollback")

// classify reads the claim statement's result: whether the message was
// fresh (not a redelivery of a dead letter), and the aggregate's version
// before (prev) and after (stored) the upsert, which equals the message's
// version only when it applied. A message that the versions say would have
// applied and did not was blocked by an open dead letter of its aggregate:
// it is held. One at the stored version that did not apply is the event
// applied last, delivered again: a duplicate; one below it is stale.
func classify(fresh, strict, baseline bool, prev, stored, version int64) outcome {
	next := version > prev
	if strict {
		next = version == prev+1 || (prev == 0 && baseline)
	}
	switch {
	case !fresh:
		return duplicate
	case stored == version && prev < version:
		return applied
	case next:
		return held
	case version == stored:
		return duplicate
	case version < stored:
		return stale
	default:
		return gap
	}
}

// deadLetter stores the whole message in dead_letters with status, in one
// transaction: from then on the message lives in the database, not in the
// broker, and a redelivery of it finds its row (claimSQL) and is a
// duplicate.
func (c *Consumer) deadLetter(ctx context.Context, msg *message.Message, env events.Envelope, status, reason, errText string) error {
	return pgx.BeginFunc(context.WithoutCancel(ctx), c.cfg.Pool, func(tx pgx.Tx) error {
		return c.deadLetterTx(ctx, tx, msg, env, status, reason, errText)
	})
}

// deadLetterTx is deadLetter inside the caller's transaction.
func (c *Consumer) deadLetterTx(ctx context.Context, tx pgx.Tx, msg *message.Message, env events.Envelope, status, reason, errText string) error {
	md, err := json.Marshal(map[string]string(msg.Metadata))
	if err != nil {
		return err
	}
	attempts, next := 0, (*time.Time)(nil)
	switch {
	case status == "dead":
		attempts = 1
	case status == "retrying":
		attempts = 1
		t := time.Now().Add(c.backoff(1))
		next = &t
	case reason == "gap":
		t := time.Now().Add(c.cfg.GapRetryDelay)
		next = &t
	}
	ctx = context.WithoutCancel(ctx)
	if _, err := tx.Exec(ctx, `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
		                          payload, metadata, status, reason, error, attempts, next_attempt_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
		ON CONFLICT (consumer, message_id) DO NOTHING`,
		c.cfg.Consumer, env.MessageID, env.EventType, env.AggregateType, env.AggregateID, env.AggregateVersion,
		[]byte(msg.Payload), md, status, reason, errText, attempts, next); err != nil {
		return fmt.Errorf("idempotency: dead-letter message: %w", err)
	}
	return nil
}

func (c *Consumer) backoff(attempt int) time.Duration {
	return backoff.Delay(c.cfg.RetryBackoff, c.cfg.RetryBackoffMax, attempt)
}
