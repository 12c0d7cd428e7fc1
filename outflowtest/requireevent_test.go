package outflowtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
)

func TestRequireEventInsideTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "accounts"}})
	require.NoError(t, err)
	v1 := newEvent(t, "acc-r1", 1, credited{Account: "acc-r1", Amount: 1250, Note: "first"})
	v2 := newEvent(t, "acc-r1", 2, closed{Account: "acc-r1"})

	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, w.PublishTx(ctx, tx, v1, v2))

	got := RequireEvent(ctx, t, tx, Want{Type: "account.credited", AggregateType: ledgerAggregate, AggregateID: "acc-r1",
		Version: 1, Topic: "accounts", Payload: map[string]any{"amount": 1250}})
	require.Equal(t, v1.MessageID, got.MessageID)
	require.False(t, got.Published)
	ev, err := got.Event(testRegistry(t))
	require.NoError(t, err)
	require.Equal(t, v1.Payload, ev.Payload)

	RequireEvent(ctx, t, tx, Want{Payload: credited{Account: "acc-r1", Amount: 1250, Note: "first"}})
	RequireEvents(ctx, t, tx, Want{Type: "account.credited", Version: 1}, Want{Type: "account.closed", Version: 2})
	RequireNoEvent(ctx, t, tx, Want{Type: "account.credited", Version: 2})
	RequireNoEvent(ctx, t, s.Pool, Want{}) // not committed: the pool sees nothing

	require.NoError(t, tx.Commit(ctx))
	RequireEvents(ctx, t, s.Pool, Want{AggregateID: "acc-r1", Version: 1}, Want{AggregateID: "acc-r1", Version: 2})
}

func TestRequireEventFailuresSayWhatWasWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := NewSchema(t)
	writeEvents(t, s.Pool,
		newEvent(t, "acc-r2", 1, credited{Account: "acc-r2", Amount: 10}),
		newEvent(t, "acc-r2", 2, credited{Account: "acc-r2", Amount: 20}))

	tests := []struct {
		name string
		run  func(t testingT)
		want []string
	}{
		{"payload differs", func(rt testingT) {
			requireEvent(ctx, rt, s.Pool, Want{Type: "account.credited", Version: 1, Payload: map[string]any{"amount": 11}})
		}, []string{"no event in the outbox matches {type=account.credited version=1 payload⊇{\"amount\":11}}",
			"it holds 2 event(s):", `1. account.credited account/acc-r2 v1 topic=account {"amount": 10, "account": "acc-r2"} (payload amount is 10, want 11)`,
			"2. account.credited account/acc-r2 v2", "(version 2, payload amount is 20, want 11)"}},
		{"missing field", func(rt testingT) {
			requireEvent(ctx, rt, s.Pool, Want{Version: 1, Payload: map[string]any{"currency": "EUR"}})
		}, []string{"payload .currency is missing"}},
		{"struct compares every field", func(rt testingT) {
			requireEvent(ctx, rt, s.Pool, Want{Version: 1, Payload: credited{Account: "acc-r2"}})
		}, []string{"payload amount is 10, want 0"}},
		{"ambiguous", func(rt testingT) {
			requireEvent(ctx, rt, s.Pool, Want{Type: "account.credited"})
		}, []string{"2 events match {type=account.credited}, expected one (use RequireEvents for several)"}},
		{"empty outbox", func(rt testingT) {
			tx, err := s.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = tx.Exec(ctx, `DELETE FROM outbox`)
			require.NoError(t, err)
			requireEvent(ctx, rt, tx, Want{Type: "account.credited"})
		}, []string{"the outbox is empty"}},
		{"events out of order", func(rt testingT) {
			requireEvents(ctx, rt, s.Pool, []Want{{Version: 2}, {Version: 1}})
		}, []string{"#1: want {version=2}, got account.credited account/acc-r2 v1", "#2: want {version=1}, got"}},
		{"too few wanted", func(rt testingT) {
			requireEvents(ctx, rt, s.Pool, []Want{{Version: 1}})
		}, []string{"#2: unexpected account.credited account/acc-r2 v2"}},
		{"too many wanted", func(rt testingT) {
			requireEvents(ctx, rt, s.Pool, []Want{{Version: 1}, {Version: 2}, {Type: "account.closed"}})
		}, []string{"#3: want {type=account.closed}, missing"}},
		{"no event expected", func(rt testingT) {
			requireNoEvent(ctx, rt, s.Pool, Want{Version: 2})
		}, []string{"expected no event matching {version=2}, found 1:", "1. account.credited account/acc-r2 v2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := fails(tt.run)
			require.NotEmpty(t, msg, "the assertion must fail")
			for _, w := range tt.want {
				require.Contains(t, msg, w)
			}
		})
	}
	// And the passing forms pass.
	require.Empty(t, fails(func(rt testingT) {
		requireEvent(ctx, rt, s.Pool, Want{Version: 2, Payload: map[string]any{"amount": 20.0}})
	}))
	require.Empty(t, fails(func(rt testingT) { requireNoEvent(ctx, rt, s.Pool, Want{Type: "account.closed"}) }))
}

func TestPayloadSubset(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, want, got, mismatch string
	}{
		{"equal", `{"a":1}`, `{"a":1}`, ""},
		{"subset", `{"a":1}`, `{"a":1,"b":2}`, ""},
		{"nested subset", `{"x":{"a":1}}`, `{"x":{"a":1,"b":2}}`, ""},
		{"nested differs", `{"x":{"a":1}}`, `{"x":{"a":2}}`, "x.a is 2, want 1"},
		{"number forms", `{"a":1250}`, `{"a":1250.0}`, ""},
		{"big integers exact", `{"a":9007199254740993}`, `{"a":9007199254740993}`, ""},
		{"arrays whole", `{"a":[1]}`, `{"a":[1,2]}`, "a is [1,2], want [1]"},
		{"missing", `{"a":1}`, `{}`, ".a is missing"},
		{"not an object", `{"x":{"a":1}}`, `{"x":3}`, "x is 3, want an object"},
		{"string vs number", `{"a":"1"}`, `{"a":1}`, `a is 1, want "1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w map[string]any
			require.NoError(t, decodeJSON([]byte(tt.want), &w))
			require.Equal(t, tt.mismatch, payloadMismatch(w, []byte(tt.got)))
		})
	}
}

var _ Querier = pgx.Tx(nil)

// ReadOutbox of a discarded row: Written.Message is the discard marker the
// forwarder sends in its place (the row's message id, version and
// correlation id, the event's own type in metadata, an empty payload), not
// its event; a handler harness given it reports it Applied (its version,
// without running the handler) and releases the aggregate's next event,
// which waited for it.
// Event refuses it. A discarded row whose metadata does not parse is read,
// its marker without that metadata, as the forwarder sends it.
func TestReadOutboxOfADiscardedRowGivesTheMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kitSchema(t)
	v1 := newEvent(t, "acc-d1", 1, credited{Account: "acc-d1", Amount: 5})
	v1.CorrelationID = "req-d1"
	v2 := newEvent(t, "acc-d1", 2, credited{Account: "acc-d1", Amount: 7})
	bad := newEvent(t, "acc-d2", 1, credited{Account: "acc-d2", Amount: 9})
	writeEvents(t, s.Pool, v1, v2, bad)
	_, err := s.Pool.Exec(ctx, `UPDATE outbox SET metadata = '{"n": 1}' WHERE message_id = $1`, bad.MessageID)
	require.NoError(t, err)
	// Parked as the forwarder parks a row, then discarded as an operator does.
	for _, mid := range []string{v1.MessageID, bad.MessageID} {
		var id int64
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT id FROM outbox WHERE message_id = $1`, mid).Scan(&id))
		require.NoError(t, ParkRow(ctx, s.Pool, id, 5, "refused"))
	}
	n, err := forwarder.DiscardParked(ctx, s.Pool, forwarder.ParkedFilter{})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)

	w := RequireEvent(ctx, t, s.Pool, Want{AggregateID: "acc-d1", Version: 1})
	var at time.Time
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT f.discarded_at FROM outbox_failures f JOIN outbox o USING (id) WHERE o.message_id = $1`, v1.MessageID).Scan(&at))
	require.NotNil(t, w.DiscardedAt)
	require.True(t, at.Equal(*w.DiscardedAt))
	require.Contains(t, w.String(), "(discarded)")
	msg := w.Message(ctx)
	require.True(t, events.IsDiscardMarker(msg), "the marker, not the event: %v", msg.Metadata)
	require.Equal(t, v1.MessageID, msg.UUID)
	require.Equal(t, "{}", string(msg.Payload))
	require.Equal(t, "account.credited", msg.Metadata.Get(events.DiscardedEventTypeKey))
	require.Equal(t, at.UTC().Format(time.RFC3339Nano), msg.Metadata.Get(events.DiscardedAtKey))
	require.Equal(t, "req-d1", msg.Metadata.Get(events.CorrelationIDKey))
	require.Equal(t, "1", msg.Metadata.Get(events.AggregateVersionKey))
	_, err = w.Event(testRegistry(t))
	require.ErrorIs(t, err, ErrDiscarded)

	// v2 first: it waits for v1, which its marker fills.
	h := NewHandlerHarness(t, s.Pool, testRegistry(t), balanceHandler(ledgerAggregate))
	next := RequireEvent(ctx, t, s.Pool, Want{AggregateID: "acc-d1", Version: 2})
	require.Nil(t, next.DiscardedAt)
	require.Equal(t, Held, h.DeliverMessage(ctx, next.Message(ctx)).Outcome)
	d := h.DeliverMessage(ctx, msg)
	require.Equal(t, Applied, d.Outcome, "the marker applies its version")
	require.Equal(t, []string{v2.MessageID}, d.Released, "and releases v2")
	require.Equal(t, 1, d.Calls, "v2's handler ran, never the marker's")
	require.Equal(t, balance{Amount: 7, Applied: []string{"2"}}, readBalance(t, s.Pool, "acc-d1"))
	require.Equal(t, Duplicate, h.DeliverMessage(ctx, msg).Outcome, "delivered again")

	wb := RequireEvent(ctx, t, s.Pool, Want{AggregateID: "acc-d2"})
	require.Nil(t, wb.Metadata)
	mb := wb.Message(ctx)
	require.True(t, events.IsDiscardMarker(mb))
	require.Empty(t, mb.Metadata.Get("n"))
}
