package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// walMessages reads, through a test_decoding slot made before the writes,
// the outbox's logical decoding messages committed so far, in commit order,
// with the transaction id each came in.
func walMessages(t *testing.T, pg *testservers.LogicalPostgres, slot string) (msgs []outbox.WALMessage, xids []uint32) {
	t.Helper()
	rows, err := pg.Pool.Query(context.Background(), `SELECT xid::text::bigint, data FROM pg_logical_slot_get_changes($1, NULL, NULL)`, slot)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var xid int64
		var data string
		require.NoError(t, rows.Scan(&xid, &data))
		// test_decoding: "message: transactional: 1 prefix: outflow, sz: N content:{...}"
		if !strings.HasPrefix(data, "message: ") {
			continue
		}
		require.Contains(t, data, "transactional: 1 prefix: "+outbox.DefaultWALPrefix+",")
		_, content, ok := strings.Cut(data, " content:")
		require.True(t, ok, data)
		var m outbox.WALMessage
		require.NoError(t, json.Unmarshal([]byte(content), &m))
		msgs = append(msgs, m)
		xids = append(xids, uint32(xid))
	}
	require.NoError(t, rows.Err())
	return msgs, xids
}

func newWALWriter(t *testing.T) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "payments"}, Mode: outbox.ModeWAL})
	require.NoError(t, err)
	return w
}

func TestWALModeEmitsOneMessagePerCallInOrderAndTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testservers.StartLogicalPostgres(t)
	_, err := pg.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('t', 'test_decoding')`)
	require.NoError(t, err)
	w := newWALWriter(t)

	a1, a2, b1 := newEvent(t, ctx, "a", 1), newEvent(t, ctx, "a", 2), newEvent(t, ctx, "b", 1)
	// pgx: two calls in one transaction are two messages in that order.
	tx, err := pg.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, tx, a1, a2))
	require.NoError(t, w.PublishTx(ctx, tx, b1))
	require.NoError(t, tx.Commit(ctx))

	// A rollback emits nothing.
	tx, err = pg.Pool.Begin(ctx)
	require.NoError(t, err)
	rolled := newEvent(t, ctx, "r", 1)
	require.NoError(t, w.PublishTx(ctx, tx, rolled))
	require.NoError(t, tx.Rollback(ctx))

	// QueueTx: the emit travels with the caller's batch.
	q1 := newEvent(t, ctx, "q", 1)
	tx, err = pg.Pool.Begin(ctx)
	require.NoError(t, err)
	b := &pgx.Batch{}
	b.Queue(`SELECT 1`)
	require.NoError(t, w.QueueTx(ctx, tx, b, q1))
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	require.NoError(t, tx.Commit(ctx))

	// database/sql.
	s1 := newEvent(t, ctx, "s", 1)
	db := stdlib.OpenDBFromPool(pg.Pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.PublishStdTx(ctx, stx, s1))
	require.NoError(t, stx.Commit())

	msgs, xids := walMessages(t, pg, "t")
	require.Len(t, msgs, 4, "one message per call, none for the rollback")
	require.Equal(t, xids[0], xids[1], "both calls of the first transaction are in it")
	ids := func(m outbox.WALMessage) (out []string) {
		for _, e := range m.Events {
			out = append(out, e.MessageID)
		}
		return out
	}
	require.Equal(t, []string{a1.MessageID, a2.MessageID}, ids(msgs[0]))
	require.Equal(t, []string{b1.MessageID}, ids(msgs[1]))
	require.Equal(t, []string{q1.MessageID}, ids(msgs[2]))
	require.Equal(t, []string{s1.MessageID}, ids(msgs[3]))

	e := msgs[0].Events[1]
	require.Equal(t, outbox.WALMessageVersion, msgs[0].V)
	require.Equal(t, "payments", e.Topic)
	require.Equal(t, a2.AggregateType, e.AggregateType)
	require.Equal(t, "a", e.AggregateID)
	require.EqualValues(t, 2, e.AggregateVersion)
	require.Equal(t, a2.EventType, e.EventType)
	require.True(t, a2.OccurredAt.Round(time.Microsecond).Equal(e.OccurredAt), "to the microsecond, as a timestamptz keeps it")
	var p invoicePaid
	require.NoError(t, json.Unmarshal(e.Payload, &p))
	require.Equal(t, "a", p.InvoiceID)
	require.NotContains(t, e.Metadata, events.SchemaVersionKey, "version 1 is the key's absence, as in table mode")
	for _, k := range []string{events.MessageIDKey, events.EventTypeKey, events.AggregateIDKey} {
		require.NotContains(t, e.Metadata, k, "the envelope's fields are not repeated in metadata")
	}

	var rows int
	require.NoError(t, pg.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows))
	require.Zero(t, rows, "the WAL mode writes no outbox row")
}

// Write emits its event as PublishTx does in the WAL mode: one message,
// in the transaction, none after a rollback.
func TestWALModeWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testservers.StartLogicalPostgres(t)
	_, err := pg.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('w', 'test_decoding')`)
	require.NoError(t, err)
	w := newWALWriter(t)
	paid := invoicePaid{InvoiceID: "w", CustomerID: "c", Amount: 5, Currency: "EUR", PaidAt: time.Now().UTC()}
	require.NoError(t, pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		return w.WriteTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: "w", Version: 1}, paid)
	}))
	tx, err := pg.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.WriteTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: "w", Version: 2}, paid))
	require.NoError(t, tx.Rollback(ctx))

	msgs, _ := walMessages(t, pg, "w")
	require.Len(t, msgs, 1, "one message, none for the rollback")
	require.Len(t, msgs[0].Events, 1)
	e := msgs[0].Events[0]
	require.Equal(t, "payments", e.Topic)
	require.Equal(t, "w", e.AggregateID)
	require.EqualValues(t, 1, e.AggregateVersion)
	require.Equal(t, "invoice.paid", e.EventType)
	var rows int
	require.NoError(t, pg.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows))
	require.Zero(t, rows, "the WAL mode writes no outbox row")
}

func TestWALModeRefusesNoTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testservers.StartLogicalPostgres(t)
	w := newWALWriter(t)
	ev := newEvent(t, ctx, "a", 1)
	require.ErrorIs(t, w.PublishTx(ctx, nil, ev), outbox.ErrNoTransaction)
	require.ErrorIs(t, w.QueueTx(ctx, nil, &pgx.Batch{}, ev), outbox.ErrNoTransaction)
	require.ErrorIs(t, w.PublishStdTx(ctx, nil, ev), outbox.ErrNoTransaction)

	tx, err := pg.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	err = w.PublishTx(ctx, tx, ev)
	require.True(t, errors.Is(err, outbox.ErrNoTransaction), "%v", err)

	db := stdlib.OpenDBFromPool(pg.Pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, stx.Rollback())
	require.ErrorIs(t, w.PublishStdTx(ctx, stx, ev), outbox.ErrNoTransaction)
}

func TestWALModeConfig(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(outbox.Config{Mode: outbox.ModeWAL, WALPrefix: "has space"})
	require.Error(t, err)
	_, err = outbox.NewWriter(outbox.Config{Mode: outbox.Mode(7)})
	require.Error(t, err)
}
