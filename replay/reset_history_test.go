package replay_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

// history is a Strict consumer with BaselineBefore whose effect is a row per
// applied version, in the order applied, and the outbox its events come
// from: the bench for a reset followed by live events and a replay.
type history struct {
	t    *testing.T
	s    *outflowtest.Schema
	h    message.HandlerFunc
	rows map[string]forwarder.Row // "aggregate@version"
}

// Times of the events: before and after the consumer's BaselineBefore.
var (
	beforeCutoff = time.Now().Add(-time.Hour)
	cutoff       = time.Now().Add(-time.Minute)
)

func newHistory(t *testing.T) *history {
	t.Helper()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `CREATE TABLE applied (seq bigint GENERATED ALWAYS AS IDENTITY, aggregate_id text NOT NULL, version bigint NOT NULL)`)
	require.NoError(t, err)
	c, err := idempotency.NewConsumer(idempotency.Config{Pool: s.Pool, Consumer: "c", BaselineBefore: cutoff,
		GapRetryDelay: time.Millisecond, GapTimeout: 100 * time.Millisecond, RetryPollInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	hi := &history{t: t, s: s, rows: map[string]forwarder.Row{}}
	hi.h = c.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := idempotency.Tx(msg.Context())
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			return nil, err
		}
		_, err = tx.Exec(msg.Context(), `INSERT INTO applied (aggregate_id, version) VALUES ($1, $2)`, env.AggregateID, env.AggregateVersion)
		return nil, err
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	return hi
}

// write puts an event of aggregate id in the outbox, published.
func (hi *history) write(id string, version int64, occurred time.Time) forwarder.Row {
	hi.t.Helper()
	r := forwarder.Row{AggregateType: "a", AggregateID: id, AggregateVersion: version, EventType: "e", Payload: "{}",
		OccurredAt: occurred}
	var outboxID int64
	require.NoError(hi.t, hi.s.Pool.QueryRow(context.Background(), `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 't', 'a', $1, $2, 'e', '{}', $3) RETURNING id, message_id::text`,
		id, version, occurred).Scan(&outboxID, &r.MessageID))
	require.NoError(hi.t, outflowtest.PublishThrough(context.Background(), hi.s.Pool, outboxID))
	hi.rows[key(id, version)] = r
	return r
}

func key(id string, version int64) string { return fmt.Sprintf("%s@%d", id, version) }

// deliver hands the consumer the events, in the order given, as the broker
// does: the stream's first delivery or a replay's (the same message).
func (hi *history) deliver(rows ...forwarder.Row) {
	hi.t.Helper()
	for _, r := range rows {
		msg, err := forwarder.Message(r)
		require.NoError(hi.t, err)
		_, err = hi.h(msg)
		require.NoError(hi.t, err)
	}
}

func (hi *history) replay(id string, versions ...int64) {
	hi.t.Helper()
	for _, v := range versions {
		hi.deliver(hi.rows[key(id, v)])
	}
}

// applied is the versions of id applied since its last reset, in order.
func (hi *history) applied(id string) []int64 {
	hi.t.Helper()
	rows, err := hi.s.Pool.Query(context.Background(), `SELECT version FROM applied WHERE aggregate_id = $1 ORDER BY seq`, id)
	require.NoError(hi.t, err)
	v, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(hi.t, err)
	return v
}

// letter is the status and error of the dead letter of r ("" if none).
func (hi *history) letter(r forwarder.Row) (status, text string) {
	_ = hi.s.Pool.QueryRow(context.Background(), `SELECT status, error FROM dead_letters WHERE message_id = $1`,
		r.MessageID).Scan(&status, &text)
	return status, text
}

func (hi *history) open() int {
	var n int
	require.NoError(hi.t, hi.s.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM dead_letters WHERE status IN ('retrying', 'dead', 'held')`).Scan(&n))
	return n
}

// reset is `outflow consumer reset` of the aggregates (all of type a when
// none), the projection's rows of them deleted in its transaction.
func (hi *history) reset(ids ...string) replay.ResetResult {
	hi.t.Helper()
	r := replay.Reset{Consumer: "c", AggregateType: "a", AggregateIDs: ids, AllAggregates: len(ids) == 0,
		Also: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM applied WHERE $1::text[] IS NULL OR aggregate_id = ANY($1)`, ids)
			return err
		}}
	res, err := replay.ResetConsumer(context.Background(), hi.s.Pool, r)
	require.NoError(hi.t, err)
	return res
}

// The scenario of issue 22 (item 4) on one aggregate: after a reset, a
// live v3 waits for v1 and v2, which the replay brings only after
// GapTimeout. v3 must be dead (a gap that names the reset), not the
// baseline, and heal once the replay applied v1 and v2. An aggregate never
// reset keeps BaselineBefore: its first event, past the same timeout,
// becomes its baseline.
func TestResetAggregateWaitsForItsHistoryPastGapTimeout(t *testing.T) {
	t.Parallel()
	hi := newHistory(t)
	hi.deliver(hi.write("x", 1, beforeCutoff), hi.write("x", 2, beforeCutoff))
	require.Equal(t, []int64{1, 2}, hi.applied("x"))
	hi.reset("x")
	require.Empty(t, hi.applied("x"))

	x3, w7 := hi.write("x", 3, time.Now()), hi.write("w", 7, time.Now())
	hi.deliver(x3, w7)
	outflowtest.WaitFor(t, 10*time.Second, "x's v3 and w's v7 to wait out GapTimeout", func() bool {
		s3, _ := hi.letter(x3)
		s7, _ := hi.letter(w7)
		return (s3 == "dead" || s3 == "resolved") && s7 == "resolved"
	})
	status, text := hi.letter(x3)
	require.Equal(t, "dead", status, "a reset aggregate's gap is dead, not a baseline")
	require.Contains(t, text, "version 3 waited")
	require.Contains(t, text, "reset")
	require.Empty(t, hi.applied("x"))
	require.Equal(t, []int64{7}, hi.applied("w"), "w, never reset, starts at its baseline")

	hi.replay("x", 1, 2)
	outflowtest.WaitFor(t, 10*time.Second, "x's v3 to heal", func() bool { s, _ := hi.letter(x3); return s == "resolved" })
	require.Equal(t, []int64{1, 2, 3}, hi.applied("x"))
	require.Zero(t, hi.open())
}

// The replay's own events, which occurred before BaselineBefore, arrive out
// of order after a reset (v2 first: another partition, a redelivery): v2
// must wait for v1 rather than become the baseline that would make v1
// stale.
func TestResetAggregateTakesNoBaselineFromAReplayedEvent(t *testing.T) {
	t.Parallel()
	hi := newHistory(t)
	hi.deliver(hi.write("x", 1, beforeCutoff), hi.write("x", 2, beforeCutoff))
	hi.reset("x")
	hi.replay("x", 2, 1)
	outflowtest.WaitFor(t, 10*time.Second, "nothing open", func() bool { return hi.open() == 0 })
	require.Equal(t, []int64{1, 2}, hi.applied("x"))
}

// An aggregate whose first versions the outbox no longer holds cannot be
// rebuilt: after a reset, its first retained event (which occurred before
// BaselineBefore, and so could be a baseline for a consumer that never saw
// the aggregate) is a gap that dead-letters after GapTimeout, naming the
// reset: never applied as if the history were complete.
func TestResetOfAPurgedAggregateDeadLetters(t *testing.T) {
	t.Parallel()
	hi := newHistory(t)
	y3 := hi.write("y", 3, beforeCutoff)
	hi.deliver(hi.write("y", 1, beforeCutoff), hi.write("y", 2, beforeCutoff), y3)
	require.Equal(t, []int64{1, 2, 3}, hi.applied("y"))
	_, err := hi.s.Pool.Exec(context.Background(), `DELETE FROM outbox WHERE aggregate_id = 'y' AND aggregate_version < 3`)
	require.NoError(t, err)
	hi.reset("y")

	hi.replay("y", 3)
	outflowtest.WaitFor(t, 10*time.Second, "y's v3 to wait out GapTimeout, or apply", func() bool {
		s, _ := hi.letter(y3)
		return s == "dead" || s == "resolved" || len(hi.applied("y")) > 0
	})
	require.Empty(t, hi.applied("y"), "nothing applied as if y's history were whole")
	status, text := hi.letter(y3)
	require.Equal(t, "dead", status)
	require.Contains(t, text, "reset")
}

// A second reset, of every aggregate: an aggregate reset twice starts again
// at version 1 again, and one the consumer has not seen yet but the outbox
// holds (z) is covered too: its events, replayed out of order, apply from
// version 1.
func TestSecondResetOfEveryAggregate(t *testing.T) {
	t.Parallel()
	hi := newHistory(t)
	hi.deliver(hi.write("x", 1, beforeCutoff), hi.write("x", 2, beforeCutoff))
	hi.reset("x")
	hi.replay("x", 1, 2)
	x3 := hi.write("x", 3, time.Now())
	hi.deliver(x3)
	outflowtest.WaitFor(t, 10*time.Second, "x applied", func() bool { return len(hi.applied("x")) == 3 })
	require.Equal(t, []int64{1, 2, 3}, hi.applied("x"))
	z1, z2 := hi.write("z", 1, beforeCutoff), hi.write("z", 2, beforeCutoff)

	hi.reset()
	x4 := hi.write("x", 4, time.Now())
	hi.deliver(x4, z2)
	outflowtest.WaitFor(t, 10*time.Second, "x's v4 to wait out GapTimeout", func() bool {
		s, _ := hi.letter(x4)
		return s == "dead" || s == "resolved"
	})
	status, _ := hi.letter(x4)
	require.Equal(t, "dead", status)
	require.Empty(t, hi.applied("x"))
	require.Empty(t, hi.applied("z"), "z's v2 waits for its v1")

	hi.replay("x", 1, 2, 3)
	hi.deliver(z1)
	outflowtest.WaitFor(t, 10*time.Second, "nothing open", func() bool { return hi.open() == 0 })
	require.Equal(t, []int64{1, 2, 3, 4}, hi.applied("x"))
	require.Equal(t, []int64{1, 2}, hi.applied("z"))
}
