package forwarder_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// flow commits n rows of fresh aggregates one at a time and waits for each
// to be published: every one is a batch that claimed rows, which is what
// moves the cursor.
func (e *env) flow(n int) {
	e.t.Helper()
	for i := range n {
		id := e.write(aggregates(1)[0], 1, testPayload{N: i})
		outflowtest.WaitFor(e.t, 10*time.Second, "a flowing row published", func() bool {
			return e.count("message_id = '"+id+"' AND published_at IS NOT NULL") == 1
		})
	}
}

// passMark keeps rows flowing until f may record its cursor past the row
// with messageID, in the row's partition (when f holds it; with any other
// owner, until the recorded cursor passed it).
func (e *env) passMark(f *forwarder.Forwarder, messageID string) {
	e.t.Helper()
	outflowtest.WaitFor(e.t, 60*time.Second, "the cursor passing the row", func() bool {
		// The partitions exist once f registered.
		var (
			id        int64
			partition *int32
		)
		require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(), `
			SELECT o.id, outbox_partition_of(o.id, o.aggregate_id) FROM outbox o WHERE o.message_id = $1`, messageID).Scan(&id, &partition))
		e.flow(1)
		if partition == nil {
			return false
		}
		if t := f.PublishedThrough(*partition); t >= 0 {
			return t >= id
		}
		return e.count("message_id = '"+messageID+"' AND published_at IS NOT NULL") == 1
	})
}

// passAll waits, writing nothing, until f may record its cursor past
// every row of the outbox, in every partition: a forwarder started after f
// stopped then publishes none of them again. passMark's rows flowing are
// not enough for that: a row is shown published once its partition's high
// passed it, but published_through, where a forwarder taking the partition
// starts, stays below the bound of any transaction tracked at its claim
// (another test's, in another schema) until a rebound raises it, up to a
// lease renewal later on an idle forwarder.
func (e *env) passAll(f *forwarder.Forwarder) {
	e.t.Helper()
	outflowtest.WaitFor(e.t, 60*time.Second, "the cursor passing every row", func() bool {
		rows, err := e.schema.Pool.Query(context.Background(), `
			SELECT p, max(id) FROM (SELECT outbox_partition_of(o.id, o.aggregate_id) AS p, o.id FROM outbox o) x
			WHERE p IS NOT NULL GROUP BY p`)
		require.NoError(e.t, err)
		var (
			partition int32
			last      int64
		)
		passed := true
		_, err = pgx.ForEachRow(rows, []any{&partition, &last}, func() error {
			passed = passed && f.PublishedThrough(partition) >= last
			return nil
		})
		require.NoError(e.t, err)
		return passed
	})
}

// Transaction A takes a low id and stays open while higher ids commit and
// are published, batch after batch: the durable cursor must not pass A's
// id while A can still commit. When A commits, its row goes out (a late
// row, read by transaction id), and before the later row of its aggregate.
func TestOutOfOrderCommitAcrossTheCursor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	f, _ := e.run(e.config())
	e.passMark(f, e.write("b", 1, testPayload{N: 1}))

	evA, err := events.New(ctx, events.Aggregate{Type: "test", ID: "a", Version: 1}, testPayload{N: 1})
	require.NoError(t, err)
	txA, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = txA.Rollback(ctx) })
	require.NoError(t, e.writer.PublishTx(ctx, txA, evA))
	var idA int64
	require.NoError(t, txA.QueryRow(ctx, `SELECT id FROM outbox WHERE message_id = $1`, evA.MessageID).Scan(&idA))

	// Rows commit above A's id and are published, batch after batch:
	// without the tracking of A the cursor would pass A's id here.
	e.flow(10)
	require.Less(t, f.PublishedThrough(0), idA, "the cursor passed the id of a transaction still open")
	require.NoError(t, txA.Commit(ctx))
	e.write("a", 2, testPayload{N: 2})
	e.flow(2)

	outflowtest.WaitFor(t, 10*time.Second, "a v1 and v2 published", func() bool {
		return e.count("aggregate_id = 'a' AND published_at IS NOT NULL") == 2
	})
	requireInOrder(t, e.stream(), 3+e.count("aggregate_id LIKE 'agg-%'"))
	e.passMark(f, evA.MessageID) // and it moves on once A ended
}

// x v1 is parked and x v2 held behind it while other rows flow and the
// cursor passes both; the operator retries v1 with the forwarder running:
// both go out, in order.
func TestParkedRowRetriedAfterTheCursorPassedIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	x1 := e.write("x", 1, testPayload{N: 1})
	rb := &refusingBroker{Broker: e.broker}
	rb.setRefused(x1)
	f, _ := e.run(e.config(func(c *forwarder.Config) { c.Broker = rb; c.MaxAttempts = 1 }))
	outflowtest.WaitFor(t, 10*time.Second, "x v1 parked", func() bool { return e.count("parked_at IS NOT NULL") == 1 })
	x2 := e.write("x", 2, testPayload{N: 2})
	e.passMark(f, x2)
	require.Zero(t, e.count("aggregate_id = 'x' AND published_at IS NOT NULL"))

	rb.setRefused()
	n, err := forwarder.RetryParked(context.Background(), e.schema.Pool, forwarder.ParkedFilter{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	e.flow(2)
	outflowtest.WaitFor(t, 10*time.Second, "x v1 and v2 published", func() bool {
		return e.count("aggregate_id = 'x' AND published_at IS NOT NULL") == 2
	})
	requireInOrder(t, e.stream(), 2+e.count("aggregate_id LIKE 'agg-%'"))
}

// A long transaction that writes no outbox row (a batch job on another
// table) holds nothing back: the cursor sees it hold no lock on the
// outbox and moves past the ids drawn meanwhile. A transaction that wrote
// an outbox row does hold it back (TestOutOfOrderCommitAcrossTheCursor).
func TestALongTransactionElsewhereHoldsTheCursorNot(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	f, _ := e.run(e.config())
	e.flow(1)
	_, err := e.schema.Pool.Exec(ctx, `CREATE TABLE batch_job (n int)`)
	require.NoError(t, err)
	long, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = long.Rollback(ctx) })
	_, err = long.Exec(ctx, `INSERT INTO batch_job VALUES (1)`)
	require.NoError(t, err)
	last := e.write("after", 1, testPayload{N: 1})
	e.passMark(f, last)
}

// The same once the forwarder is idle: a transaction that read the
// outbox in a subtransaction it rolled back (its lock on the outbox gone,
// itself still open) held the durable cursor back while it looked like a
// writer; with no row more to claim, the durable cursor (what a takeover
// starts from and what retention drops by) still passes the row once it
// no longer does.
func TestALongTransactionElsewhereHoldsTheIdleCursorNot(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.run(e.config(func(c *forwarder.Config) { c.LeaseRenewInterval = 200 * time.Millisecond }))
	e.flow(1)
	_, err := e.schema.Pool.Exec(ctx, `CREATE TABLE batch_job (n int)`)
	require.NoError(t, err)
	long, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = long.Rollback(ctx) })
	_, err = long.Exec(ctx, `INSERT INTO batch_job VALUES (1); SAVEPOINT look; SELECT count(*) FROM outbox`)
	require.NoError(t, err)
	last := e.write("after", 1, testPayload{N: 1})
	outflowtest.WaitFor(t, 20*time.Second, "the row out", func() bool { return len(e.stream()) == 2 })
	// The forwarder idle: a lease tick recorded its highs past the row,
	// with the long transaction waited for (its claims, which ask who
	// writes to the outbox, are done). A claim still running after the
	// rollback would raise the bound without the idle forwarder's asking.
	outflowtest.WaitFor(t, 20*time.Second, "the recorded cursor waiting for the long transaction", func() bool {
		return e.countSQL(`SELECT count(*) FROM outbox_partitions p, outbox o WHERE o.message_id = '`+last+`'
			AND p.published_high >= o.id AND cardinality(p.waiting_xids) > 0`) > 0
	})
	_, err = long.Exec(ctx, `ROLLBACK TO SAVEPOINT look`)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 20*time.Second, "the recorded cursor past the row, with nothing more to claim", func() bool {
		return e.countSQL(`SELECT count(*) FROM outbox o WHERE o.message_id = '`+last+`'
			AND o.id <= (SELECT min(published_through) FROM outbox_partitions)`) == 1
	})
}

// The cursor is sound only if a transaction has its transaction id before
// it draws an outbox id: the id column's default
// must call pg_current_xact_id() before nextval (migration 00011). Both
// happen inside one INSERT, so no interleaving of sessions can show the
// order; the default expression itself is what a revert to an identity
// column, or a reordered default, would change.
func TestOutboxIDIsDrawnAfterTheTransactionID(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	var def string
	require.NoError(t, s.Pool.QueryRow(context.Background(), `
		SELECT coalesce(pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = 'outbox'::regclass AND a.attname = 'id'`).Scan(&def))
	xid, next := strings.Index(def, "pg_current_xact_id()"), strings.Index(def, "nextval(")
	require.True(t, xid >= 0 && next > xid, "outbox.id's default must take the transaction id before nextval, got %q", def)
}

// A transaction that writes to one of the outbox's partitions directly
// (an INSERT, a COPY) holds a lock on the partition, not on the outbox:
// the cursor must still take it for a writer. Taken for a transaction of
// another table, its bound was raised above its row, and the row, once
// committed, was never read.
func TestAWriterOfAPartitionIsTakenForAWriter(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	f, err := forwarder.New(e.config())
	require.NoError(t, err)
	f.SetReboundEvery(0)
	e.start(f)
	e.flow(1)

	var part string
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `
		SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'outbox'::regclass AND pg_get_expr(c.relpartbound, c.oid) LIKE '%MINVALUE%'`).Scan(&part))
	conn, err := e.schema.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	insert := `INSERT INTO ` + pgx.Identifier{part}.Sanitize() + ` (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES ($1, $2, 'test', 'direct', 1, $3, '{"n":1}', now())`
	ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: "direct", Version: 1}, testPayload{N: 1})
	require.NoError(t, err)
	// The first insert into a partition in a session locks the outbox too
	// (to learn the partition's bounds), the next ones, bounds cached, do
	// not: a first one rolled back.
	warm, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = warm.Exec(ctx, insert, ev.MessageID, e.topic, ev.EventType)
	require.NoError(t, err)
	require.NoError(t, warm.Rollback(ctx))
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, insert, ev.MessageID, e.topic, ev.EventType)
	require.NoError(t, err)
	var locksOutbox bool
	require.NoError(t, tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND relation = 'outbox'::regclass)`).Scan(&locksOutbox))
	require.False(t, locksOutbox, "the writer holds no lock on the outbox itself")
	// Rows after it, claimed while it is open: each claim asks who
	// writes to the outbox.
	e.flow(3)
	require.NoError(t, tx.Commit(ctx))
	outflowtest.WaitFor(t, 20*time.Second, "the row written to the partition on the stream", func() bool {
		for _, en := range e.stream() {
			if en.messageID == ev.MessageID {
				return true
			}
		}
		return false
	})
}
