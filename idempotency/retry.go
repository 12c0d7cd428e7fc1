package idempotency

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/poll"
)

// retryRoundMax bounds the rows one retry round looks at, so that a round
// ends; the next starts at once when a round was full.
const retryRoundMax = 500

// Run retries dead letters until ctx is done: a failed message when its
// backoff has passed, and the held events of its aggregate, in version
// order, once it applied. Each round looks at every due row (up to 500),
// so held events that can apply never wait behind gaps that are still open.
// Run it next to the router, one per consumer per process; several
// processes share the work (rows are claimed with SKIP LOCKED).
func (c *Consumer) Run(ctx context.Context) error {
	poll.DrainOrWake(ctx, c.cfg.RetryPollInterval, c.wake, c.retryRound, func(err error) {
		c.cfg.Logger.Warn("retry dead letters", "consumer", c.cfg.Consumer, "error", err.Error())
	})
	return nil
}

// dueWhere picks, per aggregate, its lowest open row when it may run: a
// retrying row whose time has come; a held row whose time has come or whose
// predecessor has just been applied (a gap that closed need not wait for
// its next try); a row dead because its gap timed out, once its predecessor
// has been applied after all (the gap heals without an operator). A row
// dead after its handler failed MaxAttempts times waits for an operator.
const dueWhere = `
d.consumer = $1
  AND (d.status IN ('retrying', 'held') OR (d.status = 'dead' AND d.reason = 'gap'))
  AND ((d.status = 'retrying' AND d.next_attempt_at <= now())
       OR (d.status = 'held' AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= now()))
       OR (d.status IN ('held', 'dead') AND EXISTS (
           SELECT 1 FROM consumer_aggregate_versions c
           WHERE c.consumer = d.consumer AND c.aggregate_type = d.aggregate_type AND c.aggregate_id = d.aggregate_id
             AND c.version >= d.aggregate_version - 1)))
  AND NOT EXISTS (
      SELECT 1 FROM dead_letters e
      WHERE e.consumer = d.consumer AND e.aggregate_type = d.aggregate_type AND e.aggregate_id = d.aggregate_id
        AND e.status IN ('retrying', 'dead', 'held') AND e.aggregate_version < d.aggregate_version)`

// dueIDsSQL lists a round's rows, oldest first, without locking them, and
// whether each is a retry of a handler that failed (status retrying).
const dueIDsSQL = `SELECT d.id, d.status = 'retrying', d.aggregate_type, d.aggregate_id, d.aggregate_version
FROM dead_letters d WHERE ` + dueWhere + ` ORDER BY d.id LIMIT $2`

// lockDueSQL takes one row of the round if it is still due and no other
// process holds it.
const lockDueSQL = `
SELECT d.message_id::text, d.payload, d.metadata::text, d.attempts, d.created_at
FROM dead_letters d
WHERE d.id = $2 AND ` + dueWhere + `
FOR UPDATE SKIP LOCKED`

// afterResetNote ends the error of a dead gap on an aggregate that a reset
// made the consumer forget: what it waits for, and why no baseline.
const afterResetNote = "the aggregate was reset (outflow consumer reset) and applied nothing since: " +
	"it waits for its versions from 1, which a replay brings (outflow replay); if the outbox no longer holds them, " +
	"its history cannot be rebuilt and an operator must decide (see docs/replay.md)"

// gapEnding is what becomes of a gap that waited GapTimeout.
type gapEnding int

const (
	// gapDead: the message is dead (reason gap), reported, and heals if
	// its predecessor applies later.
	gapDead gapEnding = iota
	// gapBaseline: the message becomes its aggregate's baseline.
	gapBaseline
)

// endGap decides for a gap that timed out. Only a consumer with
// BaselineBefore may take the message as its aggregate's baseline (the
// claim then checks that nothing of the aggregate was applied), and never
// for an aggregate a reset made it forget: the reset's purpose is to apply
// the aggregate's history again from version 1, and the replay that brings
// it may well come after GapTimeout (a replay of everything takes time);
// taking a later version as the baseline would make every replayed version
// stale, silently. Such a gap stays dead, loud, until the replay heals it.
func endGap(baselineBefore, afterReset bool) gapEnding {
	if baselineBefore && !afterReset {
		return gapBaseline
	}
	return gapDead
}

// retryRound looks at every due row, up to retryRoundMax. It returns how
// many it settled, or the round's size when the round was full, so that
// poll.DrainOrWake runs another round at once when there may be more to
// do. A row still waiting for its predecessor or failing again is looked at
// and passed: it does not end the round.
//
// The rows whose handler never failed (held events whose predecessor
// applied, gaps that healed) run together, in one transaction, each in a
// savepoint of its own: one commit for the round rather than one per row,
// which is what let held events pile up faster than they were retried. A
// row whose handler failed before (retrying) runs alone, in a transaction
// of its own, one attempt per round: a handler that keeps failing must not
// hold the others' commit. A held row whose handler fails in the shared
// transaction has its failure recorded there, and runs alone from then on.
func (c *Consumer) retryRound(ctx context.Context) (int, error) {
	c.mu.Lock()
	h := c.handler
	c.mu.Unlock()
	if h == nil {
		return 0, errors.New("idempotency: Run needs the Middleware applied to a handler first")
	}
	rows, err := c.cfg.Pool.Query(ctx, dueIDsSQL, c.cfg.Consumer, retryRoundMax)
	if err != nil {
		return 0, fmt.Errorf("due dead letters: %w", err)
	}
	type due struct {
		id      int64
		alone   bool
		agg     aggKey
		version int64
	}
	dues, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		err := r.Scan(&d.id, &d.alone, &d.agg.typ, &d.agg.id, &d.version)
		return d, err
	})
	if err != nil {
		return 0, fmt.Errorf("due dead letters: %w", err)
	}
	// The rows that run together, in aggregate and version order: the
	// order in which a batch of the Middleware locks its aggregates' rows,
	// so that the round's transaction, which holds the rows it applied
	// until it commits, and a batch never wait for each other in a cycle.
	slices.SortStableFunc(dues, func(a, b due) int {
		return cmp.Or(cmp.Compare(a.agg.typ, b.agg.typ), cmp.Compare(a.agg.id, b.agg.id), cmp.Compare(a.version, b.version))
	})
	var together, alone []int64
	for _, d := range dues {
		if d.alone {
			alone = append(alone, d.id)
		} else {
			together = append(together, d.id)
		}
	}
	settled := 0
	var errs []error
	// A transaction holds the version rows it applied until it commits:
	// at most MaxBatch rows in one, as a batch of the Middleware.
	for chunk := range slices.Chunk(together, c.cfg.MaxBatch) {
		if ctx.Err() != nil {
			break
		}
		n, err := c.retryTogether(ctx, recovering(h), chunk)
		settled += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range alone {
		if ctx.Err() != nil {
			break
		}
		ok, err := c.retryOne(ctx, h, id)
		if err != nil {
			// One broken row must not stop the others: report it with the
			// round.
			errs = append(errs, fmt.Errorf("dead letter %d: %w", id, err))
			continue
		}
		if ok {
			settled++
		}
	}
	if len(dues) == retryRoundMax {
		settled = max(settled, len(dues))
	}
	c.rounds.Add(1)
	return settled, errors.Join(errs...)
}

// retryTogether runs the rows ids in one transaction, each in a savepoint
// (a broken row rolls back alone and is reported), and returns how many it
// settled.
func (c *Consumer) retryTogether(ctx context.Context, h message.HandlerFunc, ids []int64) (int, error) {
	var (
		settled int
		records []func()
		errs    []error
	)
	err := pgx.BeginFunc(ctx, c.cfg.Pool, func(tx pgx.Tx) error {
		settled, records, errs = 0, nil, nil
		for _, id := range ids {
			if ctx.Err() != nil {
				break
			}
			var (
				ok     bool
				record func()
			)
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				var err error
				ok, record, err = c.retryRow(ctx, sp, h, id)
				return err
			})
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				errs = append(errs, fmt.Errorf("dead letter %d: %w", id, err))
				continue
			}
			records = append(records, record)
			if ok {
				settled++
			}
		}
		return nil
	})
	if err != nil {
		return 0, errors.Join(append(errs, fmt.Errorf("retry held messages: %w", err))...)
	}
	for _, r := range records {
		r()
	}
	return settled, errors.Join(errs...)
}

// retryOne runs the due row id, if it still is due and no other process has
// it. It reports whether the row was settled (applied, or found stale or a
// duplicate).
func (c *Consumer) retryOne(ctx context.Context, h message.HandlerFunc, id int64) (bool, error) {
	var (
		settled bool
		record  func()
	)
	err := pgx.BeginFunc(ctx, c.cfg.Pool, func(lock pgx.Tx) error {
		var err error
		settled, record, err = c.retryRow(ctx, lock, h, id)
		return err
	})
	if err != nil {
		return false, err
	}
	record()
	return settled, nil
}

// retryRow runs the due row id in lock, if it still is due and no other
// process has it. It reports whether the row was settled, and what to
// count once lock committed.
func (c *Consumer) retryRow(ctx context.Context, lock pgx.Tx, h message.HandlerFunc, id int64) (settled bool, record func(), err error) {
	record = func() {} // the metrics, once the outcome committed
	err = func() error {
		var (
			msgID, md string
			payload   []byte
			attempts  int
			created   time.Time
		)
		err := lock.QueryRow(ctx, lockDueSQL, c.cfg.Consumer, id).Scan(&msgID, &payload, &md, &attempts, &created)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // settled meanwhile, no longer due, or another process has it
		}
		if err != nil {
			return err
		}
		msg := message.NewMessage(msgID, payload)
		if err := json.Unmarshal([]byte(md), &msg.Metadata); err != nil {
			return fmt.Errorf("metadata: %w", err)
		}
		msg.SetContext(ctx)
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			return fmt.Errorf("envelope: %w", err)
		}
		// The row stays locked (in lock) while the handler runs, so no
		// other process runs it at the same time; only open rows of lower
		// versions block it. The handler runs in a savepoint of lock, not
		// in a transaction of its own: holding one connection while
		// waiting for a second would deadlock once every connection of
		// the pool is held by a consumer's retry, and the message's
		// effects now commit with its dead letter's new status.
		start := time.Now()
		_, v, herr := c.apply(ctx, ctx, lock, h, msg, env, false, c.mayBaseline(env), false)
		o := v.outcome
		timedOut := herr == nil && time.Since(created) >= c.cfg.GapTimeout
		if timedOut && o == gap && endGap(!c.cfg.BaselineBefore.IsZero(), v.afterReset) == gapBaseline {
			// Nothing before it came in GapTimeout: with a baseline, an
			// aggregate this consumer has applied nothing of starts here.
			// Should the handler fail, herr takes the message to the
			// failing handler's retries below, not to a dead gap that
			// would wait for a predecessor that never comes.
			var base verdict
			if _, base, herr = c.apply(ctx, ctx, lock, h, msg, env, false, true, false); herr == nil && base.outcome == applied {
				o = base.outcome
				c.cfg.Logger.With(env.LogArgs()...).Warn("gap timed out on an aggregate with nothing applied: this version is its baseline",
					"consumer", c.cfg.Consumer, "message_id", msgID, "aggregate_id", env.AggregateID,
					"aggregate_version", env.AggregateVersion)
			}
		}
		switch {
		case herr == nil && (o == applied || o == stale || o == duplicate):
			settled = true
			took := time.Since(start)
			_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'resolved', resolved_at = now() WHERE id = $1`, id)
			// The events held right behind it apply with it, once its own
			// row no longer blocks them.
			var chain heldOutcome
			if err == nil && o == applied {
				chain, err = c.applyHeldBehind(ctx, lock, h, env)
			}
			record = func() {
				c.metrics.count(o, took)
				c.countHeld(chain)
				if chain.leftDue {
					c.wakeRetries()
				}
			}
			c.cfg.Logger.With(env.LogArgs()...).Info("dead letter applied", "consumer", c.cfg.Consumer, "message_id", msgID,
				"aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion, "outcome", o.String())
		case herr == nil && timedOut: // the gap never filled: report it; it heals if its predecessor applies later
			text := fmt.Sprintf("version %d waited %s for version %d", env.AggregateVersion, c.cfg.GapTimeout, env.AggregateVersion-1)
			if v.afterReset {
				text += "; " + afterResetNote
			}
			_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'dead', reason = 'gap', error = $2, next_attempt_at = NULL WHERE id = $1`,
				id, text)
			record = func() { c.metrics.failed("dead") }
			c.cfg.Logger.With(env.LogArgs()...).Error("gap timed out: message dead", "consumer", c.cfg.Consumer, "message_id", msgID,
				"aggregate_type", env.AggregateType, "aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion,
				"after_reset", v.afterReset)
		case herr == nil: // a gap (or held behind one): wait for the earlier event
			_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'held', next_attempt_at = $2 WHERE id = $1`,
				id, time.Now().Add(c.cfg.GapRetryDelay))
		default:
			// The handler's own failure: reason says so, so that a row dead
			// after MaxAttempts never heals like a timed-out gap.
			attempts++
			if attempts >= c.cfg.MaxAttempts && !waitsForDeploy(herr) {
				_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'dead', reason = 'handler failed', attempts = $2, error = $3, next_attempt_at = NULL WHERE id = $1`,
					id, attempts, herr.Error())
				record = func() { c.metrics.failed("dead") }
				c.cfg.Logger.With(env.LogArgs()...).Error("message dead-lettered after max attempts", "consumer", c.cfg.Consumer, "message_id", msgID,
					"aggregate_id", env.AggregateID, "attempts", attempts, "error", herr.Error())
			} else {
				_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'retrying', reason = 'handler failed', attempts = $2, error = $3, next_attempt_at = $4 WHERE id = $1`,
					id, attempts, herr.Error(), time.Now().Add(c.backoff(attempts)))
				record = func() { c.metrics.failed("retrying") }
			}
		}
		return err
	}()
	if err != nil {
		return false, func() {}, err
	}
	return settled, record, nil
}
