package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
)

func newEvent(t *testing.T, ctx context.Context, aggID string, version int64) events.Event {
	t.Helper()
	ev, err := events.New(ctx, events.Aggregate{Type: invoiceAggregate, ID: aggID, Version: version}, invoicePaid{
		InvoiceID: aggID, CustomerID: uuid.NewString(), Amount: 1250, Currency: "EUR", PaidAt: time.Now().UTC(),
	})
	require.NoError(t, err)
	return ev
}

func newWriter(t *testing.T) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "payments"}})
	require.NoError(t, err)
	return w
}

func countRows(t *testing.T, s *outflowtest.Schema) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

type row struct {
	MessageID        string
	Topic            string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	EventType        string
	Payload          []byte
	Metadata         map[string]string
	OccurredAt       time.Time
	State            string // outbox_state's: the forwarder's view of the row
	Attempts         int
}

func readRows(t *testing.T, s *outflowtest.Schema) []row {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `
		SELECT o.message_id::text, o.topic, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.event_type,
		       o.payload, o.metadata, o.occurred_at, s.state, s.attempts
		FROM outbox o JOIN outbox_state s USING (id) ORDER BY o.id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	return out
}

func TestPublishTxCommitWritesFullEnvelope(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	w := newWriter(t)
	ctx := events.WithTraceparent(events.WithCorrelationID(context.Background(), "corr-1"),
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	aggID := uuid.NewString()
	ev1, ev2 := newEvent(t, ctx, aggID, 1), newEvent(t, ctx, aggID, 2)

	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, tx, ev1, ev2))
	require.NoError(t, tx.Commit(ctx))

	got := readRows(t, s)
	require.Len(t, got, 2)
	for i, ev := range []events.Event{ev1, ev2} {
		r := got[i]
		require.Equal(t, ev.MessageID, r.MessageID)
		require.Equal(t, "payments", r.Topic)
		require.Equal(t, invoiceAggregate, r.AggregateType)
		require.Equal(t, aggID, r.AggregateID)
		require.Equal(t, ev.AggregateVersion, r.AggregateVersion)
		require.Equal(t, "invoice.paid", r.EventType)
		require.WithinDuration(t, ev.OccurredAt, r.OccurredAt, time.Microsecond)
		require.Equal(t, "pending", r.State)
		require.Zero(t, r.Attempts)
		require.Equal(t, "corr-1", r.Metadata[events.CorrelationIDKey])
		require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", r.Metadata[events.TraceparentKey])
		require.NotContains(t, r.Metadata, events.SchemaVersionKey, "version 1 is the key's absence: no bytes for it")
		require.NotContains(t, r.Metadata, events.MessageIDKey, "columns are not repeated in metadata")

		var p invoicePaid
		require.NoError(t, json.Unmarshal(r.Payload, &p))
		require.Equal(t, ev.Payload, p)
	}
}

func TestPublishTxRollbackLeavesNoRow(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	w := newWriter(t)
	ctx := context.Background()

	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, tx, newEvent(t, ctx, uuid.NewString(), 1)))
	require.NoError(t, tx.Rollback(ctx))

	require.Zero(t, countRows(t, s))
}

func TestPublishStdTxWithLibPQ(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	db := s.OpenLibPQ(t)
	w := newWriter(t)
	ctx := context.Background()

	commitID := uuid.NewString()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.PublishStdTx(ctx, tx, newEvent(t, ctx, commitID, 1)))
	require.NoError(t, tx.Commit())

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.PublishStdTx(ctx, tx, newEvent(t, ctx, uuid.NewString(), 1)))
	require.NoError(t, tx.Rollback())

	got := readRows(t, s)
	require.Len(t, got, 1, "the rolled-back event must not be there")
	require.Equal(t, commitID, got[0].AggregateID)
}

func TestPublishOutsideTransactionFails(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	db := s.OpenLibPQ(t)
	w := newWriter(t)
	ctx := context.Background()
	ev := newEvent(t, ctx, uuid.NewString(), 1)

	require.ErrorIs(t, w.PublishTx(ctx, nil, ev), outbox.ErrNoTransaction)
	require.ErrorIs(t, w.PublishStdTx(ctx, nil, ev), outbox.ErrNoTransaction)

	// A committed pgx transaction.
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, w.PublishTx(ctx, tx, ev), outbox.ErrNoTransaction)

	// A rolled-back database/sql transaction.
	stdTx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, stdTx.Rollback())
	require.ErrorIs(t, w.PublishStdTx(ctx, stdTx, ev), outbox.ErrNoTransaction)

	require.Zero(t, countRows(t, s), "nothing may be auto-committed")
}

func TestDuplicateMessageIDRefused(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	w := newWriter(t)
	ctx := context.Background()
	ev := newEvent(t, ctx, uuid.NewString(), 1)

	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return w.PublishTx(ctx, tx, ev)
	}))
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return w.PublishTx(ctx, tx, ev)
	})
	require.Error(t, err)
	require.Equal(t, 1, countRows(t, s))
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	env := func(typ, agg string) events.Envelope { return events.Envelope{EventType: typ, AggregateType: agg} }
	tests := []struct {
		name    string
		routes  outbox.Routes
		env     events.Envelope
		want    string
		wantErr error
	}{
		{"nil routes use the aggregate type", nil, env("payment.paid", "payment"), "payment", nil},
		{"exact match", outbox.Routes{"payment.paid": "paid", "*": "rest"}, env("payment.paid", "payment"), "paid", nil},
		{"fallback", outbox.Routes{"payment.paid": "paid", "*": "rest"}, env("payment.created", "payment"), "rest", nil},
		{"no route", outbox.Routes{"payment.paid": "paid"}, env("payment.created", "payment"), "", outbox.ErrNoRoute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.routes.Topic(tt.env)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestNewWriterRejectsBadTopic(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"payment.paid": "bad topic!"}})
	require.ErrorContains(t, err, "Routes")
}

func TestUnroutedEventFailsWholePublish(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"payment.created": "payments"}})
	require.NoError(t, err)
	ctx := context.Background()
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return w.PublishTx(ctx, tx, newEvent(t, ctx, uuid.NewString(), 1))
	})
	require.True(t, errors.Is(err, outbox.ErrNoRoute), "got %v", err)
	require.Zero(t, countRows(t, s))
}

func TestQueueTxTravelsWithTheBatch(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	w := newWriter(t)
	ctx := context.Background()

	// Committed with the batch.
	committed := uuid.NewString()
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		if err := w.QueueTx(ctx, tx, b, newEvent(t, ctx, committed, 1), newEvent(t, ctx, committed, 2)); err != nil {
			return err
		}
		require.Zero(t, countRows(t, s), "queueing writes nothing")
		return tx.SendBatch(ctx, b).Close()
	}))

	// Rolled back with the transaction.
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	b := &pgx.Batch{}
	require.NoError(t, w.QueueTx(ctx, tx, b, newEvent(t, ctx, uuid.NewString(), 1)))
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	require.NoError(t, tx.Rollback(ctx))

	// A failing INSERT surfaces from the batch, before any commit.
	dup := newEvent(t, ctx, committed, 3)
	dup.MessageID = rows0MessageID(t, s)
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		if err := w.QueueTx(ctx, tx, b, dup); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	require.Error(t, err, "a second row with a taken message_id is refused")

	rows := readRows(t, s)
	require.Len(t, rows, 2)
	require.Equal(t, committed, rows[0].AggregateID)

	require.ErrorIs(t, w.QueueTx(ctx, nil, &pgx.Batch{}, dup), outbox.ErrNoTransaction)
	require.ErrorIs(t, w.QueueTx(ctx, tx, nil, dup), outbox.ErrNoTransaction)
}

func rows0MessageID(t *testing.T, s *outflowtest.Schema) string {
	t.Helper()
	return readRows(t, s)[0].MessageID
}

// Write is events.New and PublishTx in one call: the row has the
// aggregate, the payload, and the correlation id and traceparent of ctx;
// a rollback leaves nothing; no transaction or no payload is an error.
func TestWriteBuildsAndPublishesTheEvent(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	w := newWriter(t)
	ctx := events.WithTraceparent(events.WithCorrelationID(context.Background(), "corr-w"),
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	aggID := uuid.NewString()
	agg := events.Aggregate{Type: invoiceAggregate, ID: aggID, Version: 3}
	paid := invoicePaid{InvoiceID: aggID, CustomerID: "c-1", Amount: 700, Currency: "EUR", PaidAt: time.Now().UTC().Truncate(time.Second)}

	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, agg, paid) }))
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.WriteTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: aggID, Version: 4}, paid))
	require.NoError(t, tx.Rollback(ctx))

	got := readRows(t, s)
	require.Len(t, got, 1, "the rolled-back write must not be there")
	r := got[0]
	require.NoError(t, uuid.Validate(r.MessageID))
	require.Equal(t, "payments", r.Topic)
	require.Equal(t, agg, events.Envelope{AggregateType: r.AggregateType, AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion}.Aggregate())
	require.Equal(t, "invoice.paid", r.EventType)
	require.Equal(t, "corr-w", r.Metadata[events.CorrelationIDKey])
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", r.Metadata[events.TraceparentKey])
	var p invoicePaid
	require.NoError(t, json.Unmarshal(r.Payload, &p))
	require.Equal(t, paid, p)

	require.ErrorIs(t, w.WriteTx(ctx, nil, agg, paid), outbox.ErrNoTransaction)
	tx, err = s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var envErr *events.EnvelopeError
	require.ErrorAs(t, w.WriteTx(ctx, tx, agg, nil), &envErr)
	require.Equal(t, "payload", envErr.Field)
	require.ErrorAs(t, w.WriteTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: aggID}, paid), &envErr, "version 0")
	require.Equal(t, events.AggregateVersionKey, envErr.Field)
}

// WriteStdTx is WriteTx on a database/sql transaction.
func TestWriteStdTxWithLibPQ(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	db := s.OpenLibPQ(t)
	w := newWriter(t)
	ctx := context.Background()
	aggID := uuid.NewString()
	paid := invoicePaid{InvoiceID: aggID, CustomerID: "c-2", Amount: 9, Currency: "EUR", PaidAt: time.Now().UTC().Truncate(time.Second)}

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.WriteStdTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: aggID, Version: 1}, paid))
	require.NoError(t, tx.Commit())
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.WriteStdTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: aggID, Version: 2}, paid))
	require.NoError(t, tx.Rollback())
	require.ErrorIs(t, w.WriteStdTx(ctx, nil, events.Aggregate{Type: invoiceAggregate, ID: aggID, Version: 3}, paid), outbox.ErrNoTransaction)

	got := readRows(t, s)
	require.Len(t, got, 1, "the rolled-back write must not be there")
	require.Equal(t, aggID, got[0].AggregateID)
	require.EqualValues(t, 1, got[0].AggregateVersion)
	require.Equal(t, "invoice.paid", got[0].EventType)
}
