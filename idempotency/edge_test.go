package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

func (b *bundle) run(t *testing.T, c *idempotency.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (b *bundle) status(m *message.Message) string {
	var status string
	_ = b.schema.Pool.QueryRow(context.Background(), `SELECT status FROM dead_letters WHERE message_id = $1`, m.UUID).Scan(&status)
	return status
}

func versions(from, to int64) []int64 {
	var v []int64
	for i := from; i <= to; i++ {
		v = append(v, i)
	}
	return v
}

// Twelve aggregates whose gaps stay open sit at the lowest ids and are due
// again at every round (GapRetryDelay 1ms); a held event whose predecessor
// applied sits behind them. It must apply at once, not when the gaps time
// out (an hour here).
func TestHeldEventNotStarvedByOpenGaps(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{GapRetryDelay: time.Millisecond, GapTimeout: time.Hour,
		RetryPollInterval: 20 * time.Millisecond})
	gaps := make([]*message.Message, 12)
	for i := range gaps {
		gaps[i] = msgFor(t, fmt.Sprintf("gap-%d", i), 2)
		_, err := h(gaps[i])
		require.NoError(t, err)
	}
	a2 := msgFor(t, "a", 2)
	_, err := h(a2)
	require.NoError(t, err)
	_, err = h(msgFor(t, "a", 1))
	require.NoError(t, err)
	b.run(t, b.consumer)

	outflowtest.WaitFor(t, 5*time.Second, "a's v2 applied", func() bool { return b.status(a2) == "resolved" })
	_, applied := b.balance("a")
	require.Equal(t, []int64{1, 2}, applied)
	for _, g := range gaps {
		require.Equal(t, "held", b.status(g), "an open gap is still waiting")
	}
}

// v3 waits for v2 past GapTimeout and is dead (v4 held behind it); when v2
// finally arrives and applies, v3 and v4 apply in order with no operator.
func TestTimedOutGapHealsWhenPredecessorApplies(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{GapRetryDelay: time.Millisecond, GapTimeout: 50 * time.Millisecond,
		RetryPollInterval: 5 * time.Millisecond})
	v3, v4 := msgFor(t, "a", 3), msgFor(t, "a", 4)
	for _, m := range []*message.Message{msgFor(t, "a", 1), v3, v4} {
		_, err := h(m)
		require.NoError(t, err)
	}
	b.run(t, b.consumer)
	outflowtest.WaitFor(t, 5*time.Second, "v3 dead", func() bool { return b.status(v3) == "dead" })
	require.Equal(t, "held", b.status(v4))
	_, applied := b.balance("a")
	require.Equal(t, []int64{1}, applied)

	_, err := h(msgFor(t, "a", 2))
	require.NoError(t, err)
	outflowtest.WaitFor(t, 5*time.Second, "v3 and v4 applied", func() bool { return b.status(v4) == "resolved" })
	_, applied = b.balance("a")
	require.Equal(t, []int64{1, 2, 3, 4}, applied)
	require.Equal(t, "resolved", b.status(v3))
	require.Equal(t, "resolved", b.status(v4))
	require.Zero(t, b.open())
}

// A message that first waited for its predecessor (reason gap), then failed
// in its handler MaxAttempts times, is dead for the handler's reason and
// waits for an operator, although its predecessor is applied: only a gap
// that timed out heals by itself.
func TestDeadAfterMaxAttemptsDoesNotHeal(t *testing.T) {
	t.Parallel()
	b, _ := setup(t, idempotency.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond, RetryBackoffMax: 2 * time.Millisecond,
		GapRetryDelay: time.Millisecond, RetryPollInterval: 5 * time.Millisecond})
	h := b.consumer.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get(events.AggregateIDKey) == "a" && msg.Metadata.Get(events.AggregateVersionKey) == "2" {
			b.mu.Lock()
			b.calls++
			b.mu.Unlock()
			return nil, errBroken
		}
		return b.handler(msg)
	})
	a2 := msgFor(t, "a", 2)
	for _, m := range []*message.Message{a2, msgFor(t, "a", 1)} {
		_, err := h(m)
		require.NoError(t, err)
	}
	b.run(t, b.consumer)
	outflowtest.WaitFor(t, 5*time.Second, "a's v2 dead", func() bool { return b.status(a2) == "dead" })
	var reason string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT reason FROM dead_letters WHERE message_id = $1`, a2.UUID).Scan(&reason))
	require.Equal(t, "handler failed", reason)

	// b's v2, held for its v1, is applied by a retry round: a round that
	// would have run a's v2 first (lower id) had it healed.
	calls := b.callCount()
	for _, m := range []*message.Message{msgFor(t, "b", 2), msgFor(t, "b", 1)} {
		_, err := h(m)
		require.NoError(t, err)
	}
	outflowtest.WaitFor(t, 5*time.Second, "b applied", func() bool { _, v := b.balance("b"); return len(v) == 2 })
	require.Equal(t, calls+2, b.callCount(), "only b's messages ran")
	require.Equal(t, "dead", b.status(a2))
}

var errBroken = errors.New("broken")

func (b *bundle) callCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A consumer added after the streams were trimmed: the versions 1 (and
// more) of its old aggregates never reach it. With BaselineBefore, each
// old aggregate starts at the first version it sees and applies the next
// ones in order; an aggregate created after the cut-off is still strict:
// its v2 waits for its v1.
func TestBaselineForConsumerAddedAfterTrim(t *testing.T) {
	t.Parallel()
	a3, a4, a5, b2 := msgFor(t, "a", 3), msgFor(t, "a", 4), msgFor(t, "a", 5), msgFor(t, "b", 2)
	cutoff := time.Now()
	n1, n2 := msgFor(t, "n", 1), msgFor(t, "n", 2)
	b, h := setup(t, idempotency.Config{BaselineBefore: cutoff, GapRetryDelay: 5 * time.Millisecond,
		GapTimeout: time.Hour, RetryPollInterval: 5 * time.Millisecond})
	for _, m := range []*message.Message{a3, a5, b2, n2, a4} {
		_, err := h(m)
		require.NoError(t, err)
	}
	b.run(t, b.consumer)
	outflowtest.WaitFor(t, 5*time.Second, "a's versions applied", func() bool { _, v := b.balance("a"); return len(v) == 3 })
	_, applied := b.balance("a")
	require.Equal(t, []int64{3, 4, 5}, applied)
	_, applied = b.balance("b")
	require.Equal(t, []int64{2}, applied)
	_, applied = b.balance("n")
	require.Empty(t, applied, "a new aggregate's v2 waits for its v1")
	require.Equal(t, "held", b.status(n2))

	_, err := h(n1)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 5*time.Second, "n applied, nothing open", func() bool { return b.open() == 0 })
	_, applied = b.balance("n")
	require.Equal(t, []int64{1, 2}, applied)
}

// An old aggregate whose first event the new consumer sees occurred after
// the cut-off: its predecessors never come, so once the gap times out it
// becomes the baseline instead of dead, and the next versions follow.
func TestBaselineAfterGapTimeout(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{BaselineBefore: time.Now().Add(-time.Hour), GapRetryDelay: time.Millisecond,
		GapTimeout: 50 * time.Millisecond, RetryPollInterval: 5 * time.Millisecond})
	s7 := msgFor(t, "s", 7)
	for _, m := range []*message.Message{s7, msgFor(t, "s", 8)} {
		_, err := h(m)
		require.NoError(t, err)
	}
	b.run(t, b.consumer)
	outflowtest.WaitFor(t, 5*time.Second, "s applied", func() bool { return b.open() == 0 })
	_, applied := b.balance("s")
	require.Equal(t, []int64{7, 8}, applied)
	require.Equal(t, "resolved", b.status(s7))
	require.Zero(t, b.open())
}

// Another instance holds the aggregate's version row and parks v2 (as a
// batch that found it held does) while this one handles v3: v3 must see the
// parked v2 once it has the lock, and queue behind it, under LatestWins too.
// The lock is held on purpose, and released only once v3 waits for it. It
// is taken as every holder of a version row takes it, by writing the row
// (a claim always does, a reset and a discard too): the claim's UPDATE
// then evaluates its check again on the row the holder committed.
func TestBlockedCheckReadsAfterTheLock(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{Ordering: idempotency.LatestWins})
	ctx := context.Background()
	_, err := h(msgFor(t, "x", 1))
	require.NoError(t, err)

	other, err := b.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	var pid int
	require.NoError(t, other.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = other.Exec(ctx, `UPDATE consumer_aggregate_versions SET prev_version = version, updated_at = now()
		WHERE consumer = 'balances' AND aggregate_id = 'x'`)
	require.NoError(t, err)
	v2 := msgFor(t, "x", 2)
	md, err := json.Marshal(map[string]string(v2.Metadata))
	require.NoError(t, err)
	_, err = other.Exec(ctx, `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
		                          payload, metadata, status, reason, attempts, next_attempt_at)
		VALUES ('balances', $1, 'account.credited', 'account', 'x', 2, $2, $3, 'retrying', 'handler failed', 1, now() + interval '1 hour')`,
		v2.UUID, []byte(v2.Payload), md)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { _, err := h(msgFor(t, "x", 3)); done <- err }()
	outflowtest.WaitFor(t, 5*time.Second, "v3 waiting for the lock", func() bool {
		var n int
		require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&n))
		return n > 0
	})
	require.NoError(t, other.Commit(ctx))
	require.NoError(t, <-done)

	_, applied := b.balance("x")
	require.Equal(t, []int64{1}, applied, "v3 waits behind the parked v2")
	var status string
	require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT status FROM dead_letters WHERE aggregate_id = 'x' AND aggregate_version = 3`).Scan(&status))
	require.Equal(t, "held", status)
}

// deliveries returns every version of accounts, each delivered copies
// times, shuffled.
func deliveries(t *testing.T, accounts []string, last int64, copies int) []*message.Message {
	var msgs []*message.Message
	for _, a := range accounts {
		for v := int64(1); v <= last; v++ {
			m := msgFor(t, a, v)
			for range copies {
				msgs = append(msgs, m.Copy())
			}
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return msgs
}

// deliver hands msgs to handlers from 16 goroutines, each message to a
// handler picked at random.
func deliver(t *testing.T, msgs []*message.Message, handlers ...message.HandlerFunc) {
	ch := make(chan *message.Message)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for m := range ch {
				_, err := handlers[rand.IntN(len(handlers))](m)
				require.NoError(t, err)
			}
		})
	}
	for _, m := range msgs {
		ch <- m
	}
	close(ch)
	wg.Wait()
}

func (b *bundle) requireAppliedOnceInOrder(t *testing.T, accounts []string, last int64) {
	t.Helper()
	for _, a := range accounts {
		outflowtest.WaitFor(t, 20*time.Second, a+" applied", func() bool { _, v := b.balance(a); return len(v) >= int(last) })
	}
	outflowtest.WaitFor(t, 10*time.Second, "no open dead letter", func() bool { return b.open() == 0 })
	for _, a := range accounts {
		total, applied := b.balance(a)
		require.Equal(t, versions(1, last), applied, "%s: each version once, in order", a)
		require.EqualValues(t, 10*last, total)
	}
}

// A transaction per message, 16 deliveries at once of the same and
// consecutive versions of two aggregates, each three times, in any order.
func TestConcurrentDeliveriesMaxBatchOne(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{MaxBatch: 1, GapRetryDelay: 2 * time.Millisecond, GapTimeout: time.Hour,
		RetryPollInterval: 5 * time.Millisecond})
	b.run(t, b.consumer)
	accounts := []string{"a", "b"}
	deliver(t, deliveries(t, accounts, 30, 3), h)
	b.requireAppliedOnceInOrder(t, accounts, 30)
}

// Two instances of one consumer (two processes' worth: separate Consumers,
// each with its own retries running) race on the same aggregates' versions
// and duplicates; one delivers one message at a time, the other shares
// transactions.
func TestTwoInstancesOfOneConsumerRace(t *testing.T) {
	t.Parallel()
	cfg := idempotency.Config{GapRetryDelay: 2 * time.Millisecond, GapTimeout: time.Hour, RetryPollInterval: 5 * time.Millisecond}
	one := cfg
	one.MaxBatch = 1
	b, h1 := setup(t, one)
	cfg.Pool, cfg.Consumer, cfg.Logger = b.schema.Pool, "balances", quiet()
	second, err := idempotency.NewConsumer(cfg)
	require.NoError(t, err)
	h2 := second.Middleware(b.handler)
	b.run(t, b.consumer)
	b.run(t, second)
	accounts := []string{"a", "b", "c"}
	deliver(t, deliveries(t, accounts, 30, 2), h1, h2)
	b.requireAppliedOnceInOrder(t, accounts, 30)
}

// A retry holds one connection, whatever the pool's size: with a pool of a
// single connection, a held event whose predecessor applied still applies
// (the retry used to hold its dead letter's lock on one connection while
// waiting for a second for the handler's transaction: every consumer of a
// worker retrying at once could take the whole pool and wait forever).
func TestRetryNeedsOneConnection(t *testing.T) {
	t.Parallel()
	b, _ := setup(t, idempotency.Config{})
	pcfg, err := pgxpool.ParseConfig(b.schema.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	c, err := idempotency.NewConsumer(idempotency.Config{Pool: one, Consumer: "balances", GapRetryDelay: time.Millisecond,
		RetryPollInterval: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	h := c.Middleware(b.handler)
	v2 := msgFor(t, "a", 2)
	_, err = h(v2)
	require.NoError(t, err)
	_, err = h(msgFor(t, "a", 1))
	require.NoError(t, err)
	b.run(t, c)
	outflowtest.WaitFor(t, 5*time.Second, "v2 applied by the retry", func() bool { return b.status(v2) == "resolved" })
	_, applied := b.balance("a")
	require.Equal(t, []int64{1, 2}, applied)
}

// A gap that timed out becomes the baseline by running the handler; when
// that run fails, the message is retried like any failing handler (its
// attempts counted, its error kept), not recorded as a timed-out gap: such
// a row heals only when its predecessor applies, which never comes here.
func TestBaselineHandlerFailureIsRetried(t *testing.T) {
	t.Parallel()
	b, _ := setup(t, idempotency.Config{BaselineBefore: time.Now().Add(-time.Hour), GapRetryDelay: time.Millisecond,
		GapTimeout: 50 * time.Millisecond, RetryBackoff: time.Millisecond, RetryBackoffMax: 2 * time.Millisecond,
		RetryPollInterval: 5 * time.Millisecond})
	failed := false
	h := b.consumer.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		b.mu.Lock()
		first := !failed
		failed = true
		b.mu.Unlock()
		if first {
			return nil, errBroken
		}
		return b.handler(msg)
	})
	s7 := msgFor(t, "s", 7)
	for _, m := range []*message.Message{s7, msgFor(t, "s", 8)} {
		_, err := h(m)
		require.NoError(t, err)
	}
	b.run(t, b.consumer)
	outflowtest.WaitFor(t, 5*time.Second, "s applied after its baseline run failed once", func() bool { return b.open() == 0 })
	_, applied := b.balance("s")
	require.Equal(t, []int64{7, 8}, applied)
	var attempts int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT attempts FROM dead_letters WHERE message_id = $1`, s7.UUID).Scan(&attempts))
	require.Equal(t, 1, attempts, "the failed baseline run counts as an attempt")
}
