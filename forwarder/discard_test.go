package forwarder_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The marker built for a discarded row, and the message of a row that is
// not discarded, field by field.
func TestMessageOfADiscardedRow(t *testing.T) {
	t.Parallel()
	occurred := time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC)
	discarded := time.Date(2026, 3, 5, 1, 2, 3, 400, time.FixedZone("x", 3600))
	base := forwarder.Row{
		MessageID: "0190c0de-0000-7000-8000-000000000001", AggregateType: "payment", AggregateID: "p1", AggregateVersion: 2,
		EventType: "payment.paid", Payload: `{"amount": 1000}`, OccurredAt: occurred,
		Metadata: `{"correlation_id": "c-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
	}
	envelope := map[string]string{
		events.MessageIDKey: base.MessageID, events.AggregateTypeKey: "payment", events.AggregateIDKey: "p1",
		events.AggregateVersionKey: "2", events.OccurredAtKey: "2026-03-04T05:06:07.000000008Z",
		events.CorrelationIDKey: "c-1", events.TraceparentKey: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range envelope {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	for _, tt := range []struct {
		name        string
		mut         func(*forwarder.Row)
		wantPayload string
		wantMD      map[string]string
	}{
		{"not discarded", func(*forwarder.Row) {}, `{"amount": 1000}`, with(events.EventTypeKey, "payment.paid")},
		{"discarded", func(r *forwarder.Row) { r.DiscardedAt = &discarded }, `{}`,
			with(events.EventTypeKey, events.EventTypeDiscarded, events.DiscardedEventTypeKey, "payment.paid",
				events.DiscardedAtKey, "2026-03-05T00:02:03.0000004Z")},
		{"discarded, only its correlation id and traceparent kept of its metadata, envelope keys not overridden", func(r *forwarder.Row) {
			r.DiscardedAt = &discarded
			r.Metadata = `{"correlation_id": "c-2", "tenant": "t9", "big": "` + strings.Repeat("x", 1<<20) + `", "event_type": "forged"}`
		}, `{}`, with(events.EventTypeKey, events.EventTypeDiscarded, events.DiscardedEventTypeKey, "payment.paid",
			events.DiscardedAtKey, "2026-03-05T00:02:03.0000004Z", events.CorrelationIDKey, "c-2",
			events.TraceparentKey, "")},
		{"discarded, metadata that does not parse left out", func(r *forwarder.Row) {
			r.DiscardedAt = &discarded
			r.Metadata = `{"n": 1}`
		}, `{}`, with(events.EventTypeKey, events.EventTypeDiscarded, events.DiscardedEventTypeKey, "payment.paid",
			events.DiscardedAtKey, "2026-03-05T00:02:03.0000004Z", events.CorrelationIDKey, "", events.TraceparentKey, "")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := base
			tt.mut(&r)
			msg, err := forwarder.Message(r)
			require.NoError(t, err)
			require.Equal(t, base.MessageID, msg.UUID)
			require.Equal(t, tt.wantPayload, string(msg.Payload))
			require.Equal(t, tt.wantMD, map[string]string(msg.Metadata))
			require.Equal(t, r.DiscardedAt != nil, events.IsDiscardMarker(msg))
			env, err := events.EnvelopeFromMessage(msg)
			require.NoError(t, err, "a consumer reads the marker's envelope")
			require.EqualValues(t, 2, env.AggregateVersion)
		})
	}
	_, err := forwarder.Message(forwarder.Row{MessageID: base.MessageID, Metadata: `{"n": 1}`})
	require.ErrorContains(t, err, "metadata is not a JSON object of strings", "a row not discarded still fails on it")
	// A metadata column holding JSON null (the column allows it; another
	// producer may write it) is no metadata; Message panicked on it, and
	// the forwarder calls it for every row it claims.
	for _, discardedAt := range []*time.Time{nil, &discarded} {
		r := base
		r.Metadata, r.DiscardedAt = "null", discardedAt
		msg, err := forwarder.Message(r)
		require.NoError(t, err)
		require.Empty(t, msg.Metadata.Get(events.CorrelationIDKey))
		require.Equal(t, "p1", msg.Metadata.Get(events.AggregateIDKey))
	}
}

// DiscardParked chooses rows as its filter says: a topic's parked rows
// only, or one id; rows not parked are never touched.
func TestDiscardParkedFilter(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	// A parked row is in outbox_failures; published or pending, the
	// others are rows only (the cursor tells them apart, and a discard
	// looks at neither).
	insert := func(topic, agg string, version int, parked bool) int64 {
		var id int64
		require.NoError(t, s.Pool.QueryRow(ctx, `
			WITH r AS (
				INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
				VALUES (gen_random_uuid(), $1, 't', $2, $3, 'e', '{}', now()) RETURNING id),
			f AS (INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, parked_at)
				SELECT id, 't', $2, 'failed', 5, now() FROM r WHERE $4)
			SELECT id FROM r`, topic, agg, version, parked).Scan(&id))
		return id
	}
	aPub := insert("a", "x", 1, false)
	aParked := insert("a", "x", 2, true)
	aHeld := insert("a", "x", 3, false)
	bParked := insert("b", "y", 1, true)
	bPending := insert("b", "z", 1, false)
	type state struct {
		Parked, Discarded, Due bool
		Attempts               int
	}
	read := func(id int64) state {
		var st state
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT f.parked_at IS NOT NULL, f.discarded_at IS NOT NULL, f.next_attempt_at IS NOT NULL, coalesce(f.attempts, 0)
			FROM outbox o LEFT JOIN outbox_failures f USING (id) WHERE o.id = $1`, id).Scan(&st.Parked, &st.Discarded, &st.Due, &st.Attempts))
		return st
	}

	for _, id := range []int64{aPub, aHeld, bPending} {
		n, err := forwarder.DiscardParked(ctx, s.Pool, forwarder.ParkedFilter{ID: id})
		require.NoError(t, err)
		require.Zero(t, n, "row %d is not parked", id)
	}
	n, err := forwarder.DiscardParked(ctx, s.Pool, forwarder.ParkedFilter{ID: bParked, Topic: "a"})
	require.NoError(t, err)
	require.Zero(t, n, "the id is not of that topic")
	_, err = forwarder.DiscardParked(ctx, s.Pool, forwarder.ParkedFilter{ID: -1})
	require.ErrorIs(t, err, forwarder.ErrInvalidFilter)

	n, err = forwarder.DiscardParked(ctx, s.Pool, forwarder.ParkedFilter{Topic: "a"})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, state{Discarded: true, Due: true}, read(aParked), "released as a retry is, and discarded")
	require.Equal(t, state{}, read(aHeld), "the row behind it is untouched: it goes out after it, untried")
	require.Equal(t, state{}, read(aPub))
	require.Equal(t, state{Parked: true, Attempts: 5}, read(bParked), "another topic's parked row is untouched")
	require.Equal(t, state{}, read(bPending))

	n, err = forwarder.RetryParked(ctx, s.Pool, forwarder.ParkedFilter{ID: bParked})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, state{Due: true}, read(bParked), "a retry does not discard")
}

// The end to end of a discard: an aggregate's v1 is published, its v2
// parked (too large), its v3 held behind it. Discarding v2 lets a strict
// consumer reading the real broker apply v1 (its handler), the marker of
// v2 (no handler, its version applied) and v3 (its handler), with no dead
// letter: the stream has no hole.
func TestDiscardedRowReachesAStrictConsumerAsAMarker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis, StreamPartitions: 1,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: e.topic + ":"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })
	reg := events.NewRegistry()
	require.NoError(t, reg.Register(testPayload{}))

	var (
		mu      sync.Mutex
		handled []int64 // versions the handler saw, in order
	)
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: e.schema.Pool, Broker: backend, Registry: reg, ClaimIdle: 5 * time.Second,
		Logger: e.config().Logger, Idempotency: idempotency.Config{RetryPollInterval: 10 * time.Millisecond, GapRetryDelay: 20 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, w.Add(consumer.Handler{Name: "strict", Topic: e.topic, NoReplay: true,
		Func: func(_ context.Context, _ pgx.Tx, ev events.Event) error {
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, ev.AggregateVersion)
			return nil
		}}))
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(wctx) }()
	t.Cleanup(func() { stopWorker(); require.NoError(t, <-workerDone) })
	handledNow := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(handled)
	}

	cfg := e.config(func(c *forwarder.Config) { c.Broker = backend.Broker(); c.MaxPayloadBytes = 1000 })
	_, stop := e.run(cfg)
	e.write("x", 1, testPayload{N: 1})
	outflowtest.WaitFor(t, 20*time.Second, "v1 handled", func() bool { return len(handledNow()) == 1 })
	v2 := e.write("x", 2, testPayload{N: 2, Pad: strings.Repeat("p", 2000)})
	e.write("x", 3, testPayload{N: 3})
	outflowtest.WaitFor(t, 20*time.Second, "v2 parked, v3 held behind it in outbox_failures", func() bool {
		return e.count("parked_at IS NOT NULL") == 1 && e.count("state = 'held'") == 1
	})
	stop()
	require.Equal(t, 1, e.count("published_at IS NULL AND parked_at IS NULL"), "v3 held behind v2")

	var id int64
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT id FROM outbox WHERE message_id = $1`, v2).Scan(&id))
	n, err := forwarder.DiscardParked(ctx, e.schema.Pool, forwarder.ParkedFilter{ID: id})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	e.run(cfg)

	version := func() int64 {
		var v int64
		err := e.schema.Pool.QueryRow(ctx, `SELECT version FROM consumer_aggregate_versions WHERE consumer = 'strict' AND aggregate_id = 'x'`).Scan(&v)
		require.NoError(t, err)
		return v
	}
	outflowtest.WaitFor(t, 20*time.Second, "v3 applied", func() bool { return version() == 3 })
	require.Equal(t, []int64{1, 3}, handledNow(), "the handler saw v1 and v3, never the discarded v2")
	var dead int
	// v3 may reach the middleware before the marker (the router hands
	// each message of a read to a goroutine of its own) and wait as a gap
	// the marker then resolves: only an unresolved row is a failure.
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE status <> 'resolved'`).Scan(&dead))
	require.Zero(t, dead, "nothing dead, nothing still held")
	// v3 applied after v2: the marker moved the version through 2.

	// What the broker carried for v2: the marker, not the payload.
	var found *message.Message
	streams := backend.Topics(e.topic)
	require.Len(t, streams, 1)
	entries, err := e.redis.XRange(ctx, streams[0], "-", "+").Result()
	require.NoError(t, err)
	for _, en := range entries {
		m, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(en.Values)
		require.NoError(t, err)
		if m.UUID == v2 {
			found = m
		}
	}
	require.NotNil(t, found, "v2's marker on the stream")
	require.True(t, events.IsDiscardMarker(found))
	// Published, the row leaves outbox_failures (in the mark, which
	// commits after the publish: the consumer may have applied v3 first);
	// the discard stays on the row, for replay and the journey.
	outflowtest.WaitFor(t, 20*time.Second, "v2's row out of outbox_failures", func() bool {
		return e.countSQL(`SELECT count(*) FROM outbox_failures WHERE id = $1`, id) == 0
	})
	require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM outbox WHERE id = $1 AND discarded_at IS NOT NULL`, id))
	require.Equal(t, "test.happened", found.Metadata.Get(events.DiscardedEventTypeKey))
	require.Equal(t, "{}", string(found.Payload))
}

// Retry and discard find a row by an id past 2^31: outbox.id is a bigint,
// and the statement must not type its parameter as an integer.
func TestReleaseParkedByAnIDPastInt32(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox', 'id'), 3000000000)`)
	require.NoError(t, err)
	park := func() int64 {
		var id int64
		require.NoError(t, s.Pool.QueryRow(ctx, `
			WITH r AS (
				INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
				VALUES (gen_random_uuid(), 't', 't', gen_random_uuid()::text, 1, 'e', '{}', now()) RETURNING id, aggregate_id),
			f AS (INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, parked_at)
				SELECT id, 't', aggregate_id, 'failed', 5, now() FROM r)
			SELECT id FROM r`).Scan(&id))
		return id
	}
	n, err := forwarder.RetryParked(ctx, s.Pool, forwarder.ParkedFilter{ID: park()})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	id := park()
	n, err = forwarder.DiscardParked(ctx, s.Pool, forwarder.ParkedFilter{ID: id})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var discarded bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT discarded_at IS NOT NULL FROM outbox_failures WHERE id = $1`, id).Scan(&discarded))
	require.True(t, discarded)
}

// A discarded row whose marker the broker refuses is parked again:
// ListParked says it is discarded (and when), so an operator does not
// retry it expecting its event; a row parked and never discarded says
// nothing of the kind.
func TestListParkedShowsADiscardedRowParkedAgain(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var (
		mu      sync.Mutex
		markers int
	)
	fb := &failingBroker{fail: func(o forwarder.Outgoing) error {
		mu.Lock()
		defer mu.Unlock()
		if events.IsDiscardMarker(o.Message) {
			markers++
		}
		return errors.New("broker said no")
	}}
	e.run(e.config(func(c *forwarder.Config) { c.Broker = fb; c.MaxAttempts = 1 }))
	discarded := e.write("x", 1, testPayload{N: 1})
	kept := e.write("y", 1, testPayload{N: 2})
	outflowtest.WaitFor(t, 20*time.Second, "both rows parked", func() bool { return e.count("parked_at IS NOT NULL") == 2 })
	var id int64
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT id FROM outbox WHERE message_id = $1`, discarded).Scan(&id))
	n, err := forwarder.DiscardParked(ctx, e.schema.Pool, forwarder.ParkedFilter{ID: id})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	outflowtest.WaitFor(t, 20*time.Second, "the marker refused and parked", func() bool {
		return e.count("parked_at IS NOT NULL AND discarded_at IS NOT NULL") == 1
	})
	mu.Lock()
	require.Equal(t, 1, markers, "what the broker refused the second time was the marker")
	mu.Unlock()

	var at time.Time
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT discarded_at FROM outbox_failures WHERE id = $1`, id).Scan(&at))
	parked, err := forwarder.ListParked(ctx, e.schema.Pool, 10)
	require.NoError(t, err)
	require.Len(t, parked, 2)
	require.Equal(t, discarded, parked[0].MessageID)
	require.NotNil(t, parked[0].DiscardedAt, "the discarded row says so")
	require.True(t, at.Equal(*parked[0].DiscardedAt), "and when: %s, want %s", parked[0].DiscardedAt, at)
	require.Equal(t, kept, parked[1].MessageID)
	require.Nil(t, parked[1].DiscardedAt, "a row never discarded")

	b, err := json.Marshal(parked)
	require.NoError(t, err)
	var asJSON []map[string]any
	require.NoError(t, json.Unmarshal(b, &asJSON))
	require.Contains(t, asJSON[0], "discarded_at")
	require.NotContains(t, asJSON[1], "discarded_at", "omitted when not discarded")
}
