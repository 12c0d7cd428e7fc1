package idempotency

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
)

// batcher lets messages handled at the same time share one transaction,
// the way PostgreSQL lets concurrent commits share one WAL flush: the first
// message to arrive while no batch of its consumer runs leads. It takes the
// messages waiting (up to MaxBatch), runs them in one transaction and hands
// each its result; messages arriving meanwhile wait for the next leader.
// There is no timer and no goroutine of its own: a lone message runs at
// once, alone, and batches grow only when messages arrive faster than
// transactions commit, which is when they pay.
type batcher struct {
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*pending
	running bool
}

// pending is one message waiting in a batch, and then its result.
type pending struct {
	msg  *message.Message
	env  events.Envelope
	out  []*message.Message
	err  error
	done bool
}

func (b *batcher) do(c *Consumer, h message.HandlerFunc, msg *message.Message, env events.Envelope) ([]*message.Message, error) {
	p := &pending{msg: msg, env: env}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cond == nil {
		b.cond = sync.NewCond(&b.mu)
	}
	b.queue = append(b.queue, p)
	for !p.done {
		if b.running {
			b.cond.Wait()
			continue
		}
		// Deliveries of one read arrive a few goroutine switches apart:
		// yield while the queue still grows, so the batch takes them all
		// rather than just the first. A lone message loses microseconds.
		for range 8 {
			if len(b.queue) >= c.cfg.MaxBatch {
				break
			}
			n := len(b.queue)
			b.mu.Unlock()
			runtime.Gosched()
			b.mu.Lock()
			if len(b.queue) == n || b.running {
				break
			}
		}
		if b.running { // another leader took over while we yielded
			continue
		}
		n := min(len(b.queue), c.cfg.MaxBatch)
		batch := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.running = true
		b.mu.Unlock()
		c.runBatch(h, batch)
		b.mu.Lock()
		b.running = false
		for _, q := range batch {
			q.done = true
		}
		b.cond.Broadcast()
	}
	return p.out, p.err
}

// runBatch settles every message of batch: in one transaction when it can,
// else each in a transaction of its own, as if it had arrived alone. It
// never panics: the leader runs other messages' handlers, and a panic
// escaping here would leave the batcher running forever.
func (c *Consumer) runBatch(h message.HandlerFunc, batch []*pending) {
	h = recovering(h)
	if len(batch) > 1 {
		err := c.applyBatch(h, batch)
		if err == nil {
			return
		}
		// One message failed (or the transaction did: a deadlock with
		// another process, say). Its effects and everyone's rolled back;
		// running them one by one dead-letters just the failing one.
		c.cfg.Logger.Debug("batch failed; its messages run one by one", "consumer", c.cfg.Consumer,
			"messages", len(batch), "error", err.Error())
	}
	for _, p := range batch {
		p.out, p.err = c.handleOneSafe(h, p)
	}
}

func (c *Consumer) handleOneSafe(h message.HandlerFunc, p *pending) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("idempotency: %v", r)
		}
	}()
	return c.handleOne(h, p.msg, p.env)
}

// recovering turns a handler's panic into its error, so the message is
// dead-lettered and retried like any failure instead of taking the batch down.
func recovering(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (out []*message.Message, err error) {
		defer func() {
			if r := recover(); r != nil {
				out, err = nil, fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack())
			}
		}()
		return h(msg)
	}
}

// applyBatch runs batch in one transaction: every message's bookkeeping in
// one pipelined round trip, with the read of the events held behind the
// batch's aggregates; then the handlers of the messages that apply and
// their queued statements; then the held events right behind them
// (applyHeld), so that an event that arrived before its predecessor applies
// with it rather than in a retry of its own; then the batch's own early
// messages dead-lettered; then one commit. Messages are taken in aggregate and
// version order, so that two versions of one aggregate in the batch apply
// in order and concurrent batches lock aggregates in the same order. Any
// error rolls everything back and is returned; nothing has happened then.
func (c *Consumer) applyBatch(h message.HandlerFunc, batch []*pending) error {
	slices.SortStableFunc(batch, func(a, b *pending) int {
		return cmp.Or(cmp.Compare(a.env.AggregateType, b.env.AggregateType),
			cmp.Compare(a.env.AggregateID, b.env.AggregateID),
			cmp.Compare(a.env.AggregateVersion, b.env.AggregateVersion))
	})
	// The transaction outlives any one message's context: its commit
	// decides for all of them.
	ctx := context.WithoutCancel(batch[0].msg.Context())
	start := time.Now()
	outcomes := make([]outcome, len(batch))
	var (
		chain heldOutcome
		// dueHeld: a message of the batch held as early although the
		// held events applied here made it next: Run must not wait.
		dueHeld bool
	)
	err := pgx.BeginFunc(ctx, c.cfg.Pool, func(tx pgx.Tx) error {
		chain, dueHeld = heldOutcome{}, false
		var q pgx.Batch
		envs := make([]events.Envelope, len(batch))
		for i, p := range batch {
			c.queueClaim(&q, p.env, true, c.mayBaseline(p.env))
			envs[i] = p.env
		}
		c.queueHeldBehind(&q, envs...)
		res := tx.SendBatch(ctx, &q)
		// at is each aggregate's version once the batch's messages are
		// in: the claims are read in version order, the last one stands.
		at := make(map[aggKey]int64, len(batch))
		for i, p := range batch {
			v, stored, err := c.readClaimVersion(res, p.env, c.mayBaseline(p.env))
			if err != nil {
				_ = res.Close()
				return fmt.Errorf("idempotency: record batch: %w", err)
			}
			outcomes[i] = v.outcome
			at[aggKey{p.env.AggregateType, p.env.AggregateID}] = stored
		}
		behind, err := readHeldBehind(res)
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("idempotency: record batch: %w", err)
		}
		var queued pgx.Batch
		for i, p := range batch {
			if outcomes[i] != applied {
				continue
			}
			mctx := p.msg.Context()
			p.msg.SetContext(withTx(mctx, tx, &queued))
			out, err := h(p.msg)
			p.msg.SetContext(mctx)
			if err != nil {
				return fmt.Errorf("message %s: %w", p.env.MessageID, err)
			}
			p.out = out
		}
		// Before the held events: their handlers may read what these
		// statements write.
		if err := sendQueued(ctx, tx, &queued); err != nil {
			return err
		}
		if len(behind) > 0 {
			if chain, err = c.applyHeld(ctx, tx, h, behind, at); err != nil {
				return err
			}
		}
		for i, p := range batch {
			if o := outcomes[i]; o == gap || o == held {
				reason, text := holdReason(o, p.env)
				if err := c.deadLetterTx(ctx, tx, p.msg, p.env, "held", reason, text); err != nil {
					return err
				}
				if at[aggKey{p.env.AggregateType, p.env.AggregateID}] == p.env.AggregateVersion-1 {
					dueHeld = true
				}
			}
		}
		return nil
	})
	if err != nil {
		for _, p := range batch {
			p.out = nil
		}
		return err
	}
	if chain.leftDue || dueHeld {
		c.wakeRetries()
	}
	c.countHeld(chain)
	took := time.Since(start)
	for i, p := range batch {
		c.metrics.count(outcomes[i], took)
		if o := outcomes[i]; o == duplicate || o == stale {
			c.cfg.Logger.Debug("message skipped", "consumer", c.cfg.Consumer, "message_id", p.env.MessageID,
				"aggregate_id", p.env.AggregateID, "aggregate_version", p.env.AggregateVersion, "outcome", o.String())
		}
	}
	return nil
}
