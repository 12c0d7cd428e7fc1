package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

// batchRig is a consumer whose handler credits balances, records the
// transaction each message ran in, can fail for one account, and can hold
// its first call until released, so that the messages sent meanwhile queue
// into one batch.
type batchRig struct {
	*bundle
	h        message.HandlerFunc
	gate     chan struct{}
	entered  chan struct{}
	failAcct string
	txs      map[string]int64 // message id -> transaction id
}

func newBatchRig(t *testing.T, cfg idempotency.Config) *batchRig {
	t.Helper()
	r := &batchRig{gate: make(chan struct{}), entered: make(chan struct{}, 1), txs: map[string]int64{}}
	b, _ := setup(t, cfg)
	r.bundle = b
	r.h = b.consumer.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			return nil, err
		}
		if env.AggregateID == "gate" {
			r.entered <- struct{}{}
			<-r.gate
		}
		tx, _ := idempotency.Tx(msg.Context())
		var txid int64
		if err := tx.QueryRow(msg.Context(), `SELECT txid_current()`).Scan(&txid); err != nil {
			return nil, err
		}
		b.mu.Lock()
		r.txs[msg.UUID] = txid
		fail := r.failAcct == env.AggregateID
		b.mu.Unlock()
		if fail {
			return nil, errors.New("this account is broken")
		}
		return b.handler(msg)
	})
	return r
}

// sendQueued delivers msgs concurrently while the gate holds the running
// batch, so they all queue, then opens the gate: they run as one batch.
func (r *batchRig) sendQueued(t *testing.T, msgs ...*message.Message) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := r.h(msgFor(t, "gate", 1))
		require.NoError(t, err)
	})
	<-r.entered
	for _, m := range msgs {
		wg.Go(func() {
			_, err := r.h(m)
			require.NoError(t, err, "acknowledged")
		})
	}
	outflowtest.WaitFor(t, 5*time.Second, "every message queued", func() bool { return r.consumer.Queued() == len(msgs) })
	close(r.gate)
	wg.Wait()
}

func (r *batchRig) transactions(ids ...string) map[int64]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	txs := map[int64]bool{}
	for _, id := range ids {
		if tx, ok := r.txs[id]; ok {
			txs[tx] = true
		}
	}
	return txs
}

// Out of order, with duplicates, in one batch: one transaction applies each
// version once, in order.
func TestBatchAppliesInVersionOrderOnce(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t, idempotency.Config{})
	a1, a2, a3, b1 := msgFor(t, "a", 1), msgFor(t, "a", 2), msgFor(t, "a", 3), msgFor(t, "b", 1)
	r.sendQueued(t, a3, a2.Copy(), a1, a2.Copy(), b1, a1.Copy())

	total, applied := r.balance("a")
	require.EqualValues(t, 30, total)
	require.Equal(t, []int64{1, 2, 3}, applied)
	total, _ = r.balance("b")
	require.EqualValues(t, 10, total)
	require.Len(t, r.transactions(a1.UUID, a2.UUID, a3.UUID, b1.UUID), 1, "the four messages shared one transaction")
	r.mu.Lock()
	require.Equal(t, 5, r.calls, "the gate and four messages: duplicates never reach the handler")
	r.mu.Unlock()
	require.Zero(t, r.open())
}

// One failing message in a batch: the batch rolls back and runs message by
// message, so only the failing one is parked (its aggregate's later event
// held behind it) and the rest apply once.
func TestBatchFailureParksOnlyTheFailingMessage(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t, idempotency.Config{RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond,
		RetryPollInterval: 5 * time.Millisecond})
	r.failAcct = "a"
	r.sendQueued(t, msgFor(t, "a", 1), msgFor(t, "a", 2), msgFor(t, "b", 1), msgFor(t, "b", 2))

	total, _ := r.balance("a")
	require.Zero(t, total, "the failing aggregate applied nothing")
	total, applied := r.balance("b")
	require.EqualValues(t, 20, total, "the batch's rollback did not lose or double b")
	require.Equal(t, []int64{1, 2}, applied)
	require.Equal(t, 2, r.open(), "a v1 retrying, a v2 held behind it")

	r.mu.Lock()
	r.failAcct = ""
	r.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.consumer.Run(ctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "a applied after its retry", func() bool { total, _ := r.balance("a"); return total == 20 })
	_, applied = r.balance("a")
	require.Equal(t, []int64{1, 2}, applied)
}

// A panicking handler in a batch is a failure of its message, not of the
// consumer: the batcher keeps serving.
func TestBatchSurvivesPanic(t *testing.T) {
	t.Parallel()
	b, _ := setup(t, idempotency.Config{MaxAttempts: 1})
	h := b.consumer.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		env, _ := events.EnvelopeFromMessage(msg)
		if env.AggregateID == "boom" {
			panic("handler bug")
		}
		return b.handler(msg)
	})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			acct, version := fmt.Sprintf("ok-%d", i), int64(1)
			if i%5 == 0 {
				acct, version = "boom", int64(1+i/5)
			}
			_, err := h(msgFor(t, acct, version))
			require.NoError(t, err)
		})
	}
	wg.Wait()
	for i := range 20 {
		if i%5 != 0 {
			total, _ := b.balance(fmt.Sprintf("ok-%d", i))
			require.EqualValues(t, 10, total)
		}
	}
	var dead int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM dead_letters WHERE aggregate_id = 'boom' AND status = 'dead' AND error LIKE '%handler bug%'`).Scan(&dead))
	require.Equal(t, 1, dead, "boom v1 dead with its panic; its later versions held behind it")
}

// Many concurrent deliveries, shuffled and duplicated: every aggregate ends
// with each version applied once, in order, and transactions were shared.
func TestBatchConcurrentShuffledDuplicated(t *testing.T) {
	t.Parallel()
	b, _ := setup(t, idempotency.Config{GapRetryDelay: 5 * time.Millisecond, RetryPollInterval: 5 * time.Millisecond})
	r := &batchRig{bundle: b, txs: map[string]int64{}}
	h := b.consumer.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := idempotency.Tx(msg.Context())
		var txid int64
		if err := tx.QueryRow(msg.Context(), `SELECT txid_current()`).Scan(&txid); err != nil {
			return nil, err
		}
		b.mu.Lock()
		r.txs[msg.UUID] = txid
		b.mu.Unlock()
		return b.handler(msg)
	})
	const aggregates, versions = 20, 10
	var msgs []*message.Message
	for a := range aggregates {
		for v := int64(1); v <= versions; v++ {
			m := msgFor(t, fmt.Sprintf("acct-%02d", a), v)
			msgs = append(msgs, m, m.Copy())
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.consumer.Run(ctx) }()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for _, m := range msgs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, err := h(m)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	want := make([]int64, versions)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for a := range aggregates {
		acct := fmt.Sprintf("acct-%02d", a)
		outflowtest.WaitFor(t, 10*time.Second, acct+" applied", func() bool { total, _ := b.balance(acct); return total == 10*versions })
		_, applied := b.balance(acct)
		require.Equal(t, want, applied)
	}
	r.mu.Lock()
	applied, txs := len(r.txs), map[int64]bool{}
	for _, tx := range r.txs {
		txs[tx] = true
	}
	r.mu.Unlock()
	require.Equal(t, aggregates*versions, applied)
	t.Logf("%d messages applied in %d transactions", applied, len(txs))
}

// Queued statements commit with the message or not at all: one that fails
// fails its message, which is parked like any failure, and other messages
// of the batch keep their effects.
func TestQueuedStatementsCommitWithTheirMessage(t *testing.T) {
	t.Parallel()
	b, _ := setup(t, idempotency.Config{MaxAttempts: 1})
	require.Error(t, idempotency.QueueExec(context.Background(), `SELECT 1`), "outside a handled message")
	h := b.consumer.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		env, _ := events.EnvelopeFromMessage(msg)
		total := 10
		if env.AggregateID == "bad" {
			total = -1 // breaks the CHECK below when the queue is sent
		}
		return nil, idempotency.QueueExec(msg.Context(), `
			INSERT INTO balances (account, total, applied) VALUES ($1, $2, ARRAY[$3::bigint])
			ON CONFLICT (account) DO UPDATE SET total = balances.total + excluded.total, applied = balances.applied || $3::bigint`,
			env.AggregateID, total, env.AggregateVersion)
	})
	_, err := b.schema.Pool.Exec(context.Background(), `ALTER TABLE balances ADD CHECK (total >= 0)`)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for _, acct := range []string{"a", "bad", "c", "d"} {
		wg.Go(func() {
			_, err := h(msgFor(t, acct, 1))
			require.NoError(t, err)
		})
	}
	wg.Wait()
	for _, acct := range []string{"a", "c", "d"} {
		total, applied := b.balance(acct)
		require.EqualValues(t, 10, total, acct)
		require.Equal(t, []int64{1}, applied)
	}
	total, _ := b.balance("bad")
	require.Zero(t, total)
	require.Equal(t, 1, b.open(), "the failing message is dead-lettered")
}

// A duplicate of a message that is parked for a retry, arriving in a shared
// transaction, must not advance the aggregate's version: the parked message
// would then be skipped as stale when its retry comes, and never applied.
func TestBatchedDuplicateOfAParkedMessageMovesNothing(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t, idempotency.Config{RetryBackoff: 200 * time.Millisecond, RetryBackoffMax: 400 * time.Millisecond,
		RetryPollInterval: 5 * time.Millisecond})
	a1, a2 := msgFor(t, "a", 1), msgFor(t, "a", 2)
	_, err := r.h(a1)
	require.NoError(t, err)
	r.mu.Lock()
	r.failAcct = "a"
	r.mu.Unlock()
	_, err = r.h(a2.Copy()) // fails: parked for a retry, version stays 1
	require.NoError(t, err)
	r.mu.Lock()
	r.failAcct = ""
	r.mu.Unlock()
	r.sendQueued(t, a2.Copy(), msgFor(t, "b", 1)) // the duplicate, in a batch of two

	var version int64
	require.NoError(t, r.schema.Pool.QueryRow(context.Background(),
		`SELECT version FROM consumer_aggregate_versions WHERE consumer = 'balances' AND aggregate_id = 'a'`).Scan(&version))
	require.EqualValues(t, 1, version, "the duplicate did not apply, so the version did not move")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.consumer.Run(ctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "the parked v2 applied by its retry", func() bool { total, _ := r.balance("a"); return total == 20 })
	_, applied := r.balance("a")
	require.Equal(t, []int64{1, 2}, applied)
}

// version reads the consumer's version of account's aggregate.
func (r *batchRig) version(t *testing.T, account string) int64 {
	t.Helper()
	var v int64
	require.NoError(t, r.schema.Pool.QueryRow(context.Background(),
		`SELECT version FROM consumer_aggregate_versions WHERE consumer = 'balances' AND aggregate_id = $1`, account).Scan(&v))
	return v
}

// Held events right behind a predecessor apply in the predecessor's own
// transaction, with no retry loop running: alone (a message of its own)
// and in a shared batch.
func TestHeldEventAppliesWithItsPredecessor(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched %t", batched), func(t *testing.T) {
			t.Parallel()
			r := newBatchRig(t, idempotency.Config{RetryPollInterval: time.Hour, GapRetryDelay: time.Hour, GapTimeout: 2 * time.Hour})
			a2, a3, a5 := msgFor(t, "a", 2), msgFor(t, "a", 3), msgFor(t, "a", 5)
			for _, m := range []*message.Message{a3, a2, a5} { // early: held
				_, err := r.h(m)
				require.NoError(t, err)
			}
			require.Equal(t, 3, r.open())
			a1 := msgFor(t, "a", 1)
			if batched {
				r.sendQueued(t, a1, msgFor(t, "b", 1))
			} else {
				_, err := r.h(a1)
				require.NoError(t, err)
			}
			_, applied := r.balance("a")
			require.Equal(t, []int64{1, 2, 3}, applied, "v2 and v3 applied behind v1; v5 still waits for v4")
			require.EqualValues(t, 3, r.version(t, "a"))
			require.Len(t, r.transactions(a1.UUID, a2.UUID, a3.UUID), 1, "in v1's transaction")
			require.Equal(t, "resolved", r.status(a2))
			require.Equal(t, "resolved", r.status(a3))
			require.Equal(t, "held", r.status(a5))
			require.Equal(t, 1, r.open())
		})
	}
}

// A retry round applies its due held events in one transaction, and the
// events held right behind them too; a row whose handler failed before
// runs alone, in a transaction of its own, one attempt per round.
func TestRetryRoundAppliesHeldEventsTogether(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t, idempotency.Config{RetryPollInterval: time.Hour, GapRetryDelay: time.Hour, GapTimeout: 2 * time.Hour,
		RetryBackoff: time.Hour, RetryBackoffMax: time.Hour})
	ctx := context.Background()
	var held []*message.Message
	for _, acct := range []string{"a", "b", "c"} {
		m := msgFor(t, acct, 2)
		held = append(held, m)
		_, err := r.h(m)
		require.NoError(t, err)
	}
	a3 := msgFor(t, "a", 3)
	_, err := r.h(a3)
	require.NoError(t, err)
	r.mu.Lock()
	r.failAcct = "d"
	r.mu.Unlock()
	d1 := msgFor(t, "d", 1)
	_, err = r.h(d1) // fails: retrying, due in an hour
	require.NoError(t, err)
	require.Equal(t, "retrying", r.status(d1))
	// The predecessors applied elsewhere (a worker of another process, say):
	// the held events are due, and no transaction of this one applied them.
	_, err = r.schema.Pool.Exec(ctx, `
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
		SELECT 'balances', 'account', a, 1 FROM unnest(ARRAY['a', 'b', 'c']) a`)
	require.NoError(t, err)
	_, err = r.schema.Pool.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = now() WHERE message_id = $1`, d1.UUID)
	require.NoError(t, err)

	n, err := r.consumer.RetryRound(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "the three due held events; v3 applied behind a's v2; d's v1 failed again")
	for _, m := range held {
		require.Equal(t, "resolved", r.status(m))
	}
	require.Equal(t, "resolved", r.status(a3), "held right behind a's v2: applied with it")
	ids := []string{a3.UUID}
	for _, m := range held {
		ids = append(ids, m.UUID)
	}
	require.Len(t, r.transactions(ids...), 1, "one transaction for the round's held events")
	dtx := r.transactions(d1.UUID)
	require.Len(t, dtx, 1)
	for tx := range dtx {
		require.NotContains(t, r.transactions(ids...), tx, "the failing row ran alone")
	}
	var attempts int
	require.NoError(t, r.schema.Pool.QueryRow(ctx, `SELECT attempts FROM dead_letters WHERE message_id = $1`, d1.UUID).Scan(&attempts))
	require.Equal(t, 2, attempts, "one attempt in the round")
	require.Equal(t, "retrying", r.status(d1))
}

// Run waits RetryPollInterval (an hour here) between rounds, unless a
// commit makes a parked event due: a batch applies v1 and, behind it, the
// held v2, and parks its own v3, which arrived early but is next now. The
// batch wakes Run, which applies v3 at once.
func TestRunWokenWhenAPredecessorApplies(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t, idempotency.Config{RetryPollInterval: time.Hour, GapRetryDelay: time.Hour, GapTimeout: 2 * time.Hour})
	a2, a3 := msgFor(t, "a", 2), msgFor(t, "a", 3)
	_, err := r.h(a2)
	require.NoError(t, err)
	r.run(t, r.consumer)
	outflowtest.WaitFor(t, 5*time.Second, "Run's first round done: it waits for its next", func() bool { return r.consumer.Rounds() >= 1 })
	require.Equal(t, "held", r.status(a2))

	r.sendQueued(t, msgFor(t, "a", 1), a3)
	outflowtest.WaitFor(t, 5*time.Second, "v3 applied by the woken Run", func() bool { return r.status(a3) == "resolved" })
	_, applied := r.balance("a")
	require.Equal(t, []int64{1, 2, 3}, applied)
}
