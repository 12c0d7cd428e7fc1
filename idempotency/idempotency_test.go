package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

type credited struct {
	Amount int64 `json:"amount"`
}

func (credited) EventType() string { return "account.credited" }

type bundle struct {
	t        *testing.T
	schema   *outflowtest.Schema
	calls    int
	mu       sync.Mutex
	fail     error
	consumer *idempotency.Consumer
}

// handler adds the event's amount to a balance, in the middleware's
// transaction, and records the order it applied versions in.
func (b *bundle) handler(msg *message.Message) ([]*message.Message, error) {
	b.mu.Lock()
	b.calls++
	fail := b.fail
	b.mu.Unlock()
	tx, ok := idempotency.Tx(msg.Context())
	if !ok {
		return nil, errors.New("no transaction in the message context")
	}
	env, err := events.EnvelopeFromMessage(msg)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(msg.Context(), `
		INSERT INTO balances (account, total, applied) VALUES ($1, 10, ARRAY[$2::bigint])
		ON CONFLICT (account) DO UPDATE SET total = balances.total + 10, applied = balances.applied || $2::bigint`,
		env.AggregateID, env.AggregateVersion); err != nil {
		return nil, err
	}
	return nil, fail
}

func setup(t *testing.T, cfg idempotency.Config) (*bundle, message.HandlerFunc) {
	t.Helper()
	b := &bundle{t: t, schema: outflowtest.NewSchema(t)}
	_, err := b.schema.Pool.Exec(context.Background(),
		`CREATE TABLE balances (account text PRIMARY KEY, total bigint NOT NULL, applied bigint[] NOT NULL)`)
	require.NoError(t, err)
	cfg.Pool = b.schema.Pool
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Consumer == "" {
		cfg.Consumer = "balances"
	}
	c, err := idempotency.NewConsumer(cfg)
	require.NoError(t, err)
	b.consumer = c
	return b, c.Middleware(b.handler)
}

func msgFor(t testing.TB, account string, version int64) *message.Message {
	t.Helper()
	ev, err := events.New(context.Background(), events.Aggregate{Type: "account", ID: account, Version: version}, credited{Amount: 10})
	require.NoError(t, err)
	m, err := ev.Message(context.Background())
	require.NoError(t, err)
	return m
}

func (b *bundle) balance(account string) (int64, []int64) {
	var total int64
	var applied []int64
	err := b.schema.Pool.QueryRow(context.Background(), `SELECT total, applied FROM balances WHERE account = $1`, account).Scan(&total, &applied)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	require.NoError(b.t, err)
	return total, applied
}

func TestDuplicateDeliveryHasOneEffect(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{})
	m := msgFor(t, "a", 1)
	for range 3 {
		_, err := h(m.Copy())
		require.NoError(t, err)
	}
	total, _ := b.balance("a")
	require.EqualValues(t, 10, total)
	require.Equal(t, 1, b.calls, "the handler ran once")
}

// The ack is lost after the commit (a crash): the redelivery finds the
// processed row and has no second effect.
func TestRedeliveryAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{})
	m := msgFor(t, "a", 1)
	_, err := h(m)
	require.NoError(t, err)
	redelivered := message.NewMessage(m.UUID, m.Payload) // as the broker sends it again
	redelivered.Metadata = m.Metadata
	_, err = h(redelivered)
	require.NoError(t, err)
	total, _ := b.balance("a")
	require.EqualValues(t, 10, total)
}

func TestConcurrentDuplicatesApplyOnce(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{})
	m := msgFor(t, "a", 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := h(m.Copy())
			require.NoError(t, err)
		})
	}
	wg.Wait()
	total, _ := b.balance("a")
	require.EqualValues(t, 10, total)
}

func TestSameMessageOncePerConsumer(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{Consumer: "one"})
	c2, err := idempotency.NewConsumer(idempotency.Config{Pool: b.schema.Pool, Consumer: "two"})
	require.NoError(t, err)
	h2 := c2.Middleware(b.handler)
	m := msgFor(t, "a", 1)
	_, err = h(m.Copy())
	require.NoError(t, err)
	_, err = h2(m.Copy())
	require.NoError(t, err)
	total, _ := b.balance("a")
	require.EqualValues(t, 20, total, "each consumer applies it once")
}

// A failing handler's effects roll back; the message is parked for a retry
// (and acknowledged), its aggregate's later events queue behind it while
// other aggregates flow, and Run applies them all in order once it succeeds.
func TestFailedHandlerRetriedInOrderWhileOthersFlow(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{RetryBackoff: 20 * time.Millisecond, RetryBackoffMax: 40 * time.Millisecond,
		RetryPollInterval: 10 * time.Millisecond})
	b.setFail(errors.New("downstream broke"))
	_, err := h(msgFor(t, "a", 1))
	require.NoError(t, err, "acknowledged: the message now waits in dead_letters")
	total, _ := b.balance("a")
	require.Zero(t, total, "the failed attempt's effect rolled back")

	b.setFail(nil)
	_, err = h(msgFor(t, "a", 2))
	require.NoError(t, err)
	_, err = h(msgFor(t, "b", 1))
	require.NoError(t, err)
	total, _ = b.balance("a")
	require.Zero(t, total, "a v2 waits behind its failed v1")
	total, _ = b.balance("b")
	require.EqualValues(t, 10, total, "another aggregate flows")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.consumer.Run(ctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "a applied", func() bool { total, _ := b.balance("a"); return total == 20 })
	_, applied := b.balance("a")
	require.Equal(t, []int64{1, 2}, applied)
	outflowtest.WaitFor(t, 5*time.Second, "no open dead letter", func() bool { return b.open() == 0 })
}

func TestMaxAttemptsThenDead(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{MaxAttempts: 3, RetryBackoff: time.Millisecond, RetryBackoffMax: 2 * time.Millisecond,
		RetryPollInterval: 5 * time.Millisecond})
	b.setFail(errors.New("always broken"))
	m := msgFor(t, "a", 1)
	_, err := h(m)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.consumer.Run(ctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "the message dead", func() bool {
		var status string
		_ = b.schema.Pool.QueryRow(context.Background(), `SELECT status FROM dead_letters WHERE message_id = $1`, m.UUID).Scan(&status)
		return status == "dead"
	})
	var attempts int
	var lastErr string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT attempts, error FROM dead_letters WHERE message_id = $1`, m.UUID).Scan(&attempts, &lastErr))
	require.Equal(t, 3, attempts)
	require.Contains(t, lastErr, "always broken")
	b.mu.Lock()
	require.Equal(t, 3, b.calls)
	b.mu.Unlock()
}

func (b *bundle) setFail(err error) {
	b.mu.Lock()
	b.fail = err
	b.mu.Unlock()
}

func (b *bundle) open() int {
	var n int
	require.NoError(b.t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM dead_letters WHERE status IN ('retrying', 'dead', 'held')`).Scan(&n))
	return n
}

// v2 arrives first: it is held (and the stream moves on); v1 applies when
// it arrives; Run then applies v2.
func TestV2BeforeV1AppliesBothInOrder(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{GapRetryDelay: 5 * time.Millisecond, RetryPollInterval: 5 * time.Millisecond})
	v1, v2 := msgFor(t, "a", 1), msgFor(t, "a", 2)

	_, err := h(v2.Copy())
	require.NoError(t, err, "acknowledged: held in the database")
	total, _ := b.balance("a")
	require.Zero(t, total, "v2 is not applied before v1")

	_, err = h(v1.Copy())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.consumer.Run(ctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "both applied", func() bool { total, _ := b.balance("a"); return total == 20 })
	_, applied := b.balance("a")
	require.Equal(t, []int64{1, 2}, applied)
	outflowtest.WaitFor(t, 5*time.Second, "no open dead letter", func() bool { return b.open() == 0 })
}

func TestStaleVersionSkipped(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{})
	for v := int64(1); v <= 3; v++ {
		_, err := h(msgFor(t, "a", v))
		require.NoError(t, err)
	}
	// Another event claiming version 2 (e.g. re-emitted under a new id) is stale.
	_, err := h(msgFor(t, "a", 2))
	require.NoError(t, err, "a stale event is acknowledged")
	total, applied := b.balance("a")
	require.EqualValues(t, 30, total)
	require.Equal(t, []int64{1, 2, 3}, applied)
}

func TestLatestWinsSkipsOlder(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{Ordering: idempotency.LatestWins})
	for _, v := range []int64{3, 1, 5, 4} {
		_, err := h(msgFor(t, "a", v))
		require.NoError(t, err)
	}
	_, applied := b.balance("a")
	require.Equal(t, []int64{3, 5}, applied)
}

func TestGapTimesOutIntoDeadLetters(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{GapRetryDelay: time.Millisecond, GapTimeout: 50 * time.Millisecond,
		RetryPollInterval: 5 * time.Millisecond})
	m := msgFor(t, "a", 7)
	_, err := h(m)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.consumer.Run(ctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "the gap reported dead", func() bool {
		var status string
		_ = b.schema.Pool.QueryRow(context.Background(), `SELECT status FROM dead_letters WHERE message_id = $1`, m.UUID).Scan(&status)
		return status == "dead"
	})
	var reason string
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT reason FROM dead_letters WHERE message_id = $1`, m.UUID).Scan(&reason))
	require.Equal(t, "gap", reason)
	total, _ := b.balance("a")
	require.Zero(t, total)
}

func TestManyAggregatesInterleaved(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{})
	// Every message twice, aggregates interleaved.
	accts := make([]string, 3)
	for i := range accts {
		accts[i] = fmt.Sprintf("acct-%d-%s", i, uuid.NewString()[:4])
	}
	for v := int64(1); v <= 5; v++ {
		for _, a := range accts {
			m := msgFor(t, a, v)
			for range 2 {
				_, err := h(m.Copy())
				require.NoError(t, err)
			}
		}
	}
	for _, a := range accts {
		total, applied := b.balance(a)
		require.EqualValues(t, 50, total)
		require.Equal(t, []int64{1, 2, 3, 4, 5}, applied)
	}
}

func TestDeadLetterRetryAndDiscard(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{MaxAttempts: 1, RetryPollInterval: 5 * time.Millisecond})
	ctx := context.Background()
	b.setFail(errors.New("broken"))
	// a: v1 dies (max attempts 1), v2 waits behind it.
	_, err := h(msgFor(t, "a", 1))
	require.NoError(t, err)
	b.setFail(nil)
	_, err = h(msgFor(t, "a", 2))
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = b.consumer.Run(rctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "v1 dead", func() bool {
		dls, err := idempotency.ListDeadLetters(ctx, b.schema.Pool, "balances", 10)
		require.NoError(t, err)
		return len(dls) == 2 && dls[0].Status == "dead" && dls[1].Status == "held"
	})

	// Retrying it, now that the handler works, applies v1 then v2.
	dls, err := idempotency.ListDeadLetters(ctx, b.schema.Pool, "", 10)
	require.NoError(t, err)
	n, err := idempotency.RetryDeadLetter(ctx, b.schema.Pool, "", dls[0].ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	outflowtest.WaitFor(t, 5*time.Second, "a applied", func() bool { total, _ := b.balance("a"); return total == 20 })

	// c: v1 dies; discarding it releases v2 without applying v1.
	b.setFail(errors.New("broken"))
	_, err = h(msgFor(t, "c", 1))
	require.NoError(t, err)
	b.setFail(nil)
	_, err = h(msgFor(t, "c", 2))
	require.NoError(t, err)
	var deadID int64
	outflowtest.WaitFor(t, 5*time.Second, "c v1 dead", func() bool {
		dls, err := idempotency.ListDeadLetters(ctx, b.schema.Pool, "balances", 10)
		require.NoError(t, err)
		for _, d := range dls {
			if d.AggregateID == "c" && d.Status == "dead" {
				deadID = d.ID
				return true
			}
		}
		return false
	})
	require.ErrorIs(t, idempotency.DiscardDeadLetter(ctx, b.schema.Pool, deadID+1000), idempotency.ErrNotDead)
	require.NoError(t, idempotency.DiscardDeadLetter(ctx, b.schema.Pool, deadID))
	outflowtest.WaitFor(t, 5*time.Second, "c v2 applied", func() bool { total, _ := b.balance("c"); return total == 10 })
	_, applied := b.balance("c")
	require.Equal(t, []int64{2}, applied)
	outflowtest.WaitFor(t, 5*time.Second, "no open dead letter", func() bool { return b.open() == 0 })
}

// A redelivery of a message parked for a retry is a duplicate although its
// version is exactly the next one: the claim finds its open dead letter by
// (consumer, message_id). It neither runs the handler out of its backoff
// nor moves the version, the parked row, or anything per message.
func TestDuplicateOfAParkedMessageMovesNothing(t *testing.T) {
	t.Parallel()
	for _, maxBatch := range []int{1, 100} {
		t.Run(fmt.Sprintf("max batch %d", maxBatch), func(t *testing.T) {
			t.Parallel()
			b, h := setup(t, idempotency.Config{MaxBatch: maxBatch, RetryBackoff: time.Hour, RetryBackoffMax: time.Hour})
			_, err := h(msgFor(t, "a", 1))
			require.NoError(t, err)
			b.setFail(errors.New("downstream broke"))
			a2 := msgFor(t, "a", 2)
			_, err = h(a2.Copy()) // parked for a retry in an hour; the version stays 1
			require.NoError(t, err)
			b.setFail(nil)
			calls := b.calls

			_, err = h(a2.Copy())
			require.NoError(t, err, "the duplicate is acknowledged")
			require.Equal(t, calls, b.calls, "the handler did not run out of its backoff")
			var version int64
			require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
				`SELECT version FROM consumer_aggregate_versions WHERE consumer = 'balances' AND aggregate_id = 'a'`).Scan(&version))
			require.EqualValues(t, 1, version, "the version did not move")
			var status string
			var attempts int
			require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
				`SELECT status, attempts FROM dead_letters WHERE message_id = $1`, a2.UUID).Scan(&status, &attempts))
			require.Equal(t, "retrying", status)
			require.Equal(t, 1, attempts)
			require.Equal(t, 1, b.open())
			var processed int
			require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM processed_messages`).Scan(&processed))
			require.Zero(t, processed, "nothing recorded per message")
		})
	}
}
