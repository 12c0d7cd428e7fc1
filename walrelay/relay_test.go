package walrelay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/walrelay"
)

// memBroker acknowledges what it appends, in order; down makes it
// unavailable, refuse refuses the listed message ids for their own reason.
type memBroker struct {
	mu      sync.Mutex
	down    bool
	refuse  map[string]bool
	offered map[string]int
	got     []forwarder.Outgoing
}

func newMemBroker() *memBroker {
	return &memBroker{refuse: map[string]bool{}, offered: map[string]int{}}
}

func (b *memBroker) Publish(_ context.Context, msgs []forwarder.Outgoing) []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		b.offered[m.Message.UUID]++
		switch {
		case b.down:
			errs[i] = fmt.Errorf("%w: injected outage", forwarder.ErrBrokerUnavailable)
		case b.refuse[m.Message.UUID]:
			errs[i] = fmt.Errorf("injected refusal of %s", m.Message.UUID)
		default:
			b.got = append(b.got, m)
		}
	}
	return errs
}

func (b *memBroker) setDown(v bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = v
}

func (b *memBroker) setRefused(ids ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuse = map[string]bool{}
	for _, id := range ids {
		b.refuse[id] = true
	}
}

func (b *memBroker) offers(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.offered[id]
}

// ids is what the broker appended, message ids in order.
func (b *memBroker) ids() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, len(b.got))
	for i, m := range b.got {
		out[i] = m.Message.UUID
	}
	return out
}

func (b *memBroker) has(id string) bool {
	for _, x := range b.ids() {
		if x == id {
			return true
		}
	}
	return false
}

// testLogger is silent unless OUTFLOW_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("OUTFLOW_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// logger keeps the relay's log, and prints it when the test fails (a
// wait that times out says nothing of why by itself).
func (e *env) logger() *slog.Logger {
	if os.Getenv("OUTFLOW_TEST_LOG") != "" {
		return testLogger()
	}
	var buf outflowtest.LogBuffer
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("the relay's log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(&buf, nil))
}

type env struct {
	t      *testing.T
	pg     *testservers.LogicalPostgres
	broker *memBroker
	writer *outbox.Writer
}

func setup(t *testing.T, settings ...string) *env {
	t.Helper()
	pg := testservers.StartLogicalPostgres(t, settings...)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "orders"}, Mode: outbox.ModeWAL})
	require.NoError(t, err)
	return &env{t: t, pg: pg, broker: newMemBroker(), writer: w}
}

type orderPlaced struct {
	N int `json:"n"`
}

func (orderPlaced) EventType() string { return "order.placed" }

func (e *env) event(agg string, version int64) events.Event {
	ev, err := events.New(context.Background(), events.Aggregate{Type: "order", ID: agg, Version: version}, orderPlaced{N: int(version)})
	require.NoError(e.t, err)
	return ev
}

// write commits one transaction with evs and returns their ids.
func (e *env) write(evs ...events.Event) []string {
	e.t.Helper()
	ids, _ := e.writeXID(evs...)
	return ids
}

// writeXID commits one transaction with evs and returns their ids and the
// transaction's id.
func (e *env) writeXID(evs ...events.Event) (ids []string, xid string) {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pg.Pool.Begin(ctx)
	require.NoError(e.t, err)
	require.NoError(e.t, e.writer.PublishTx(ctx, tx, evs...))
	require.NoError(e.t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid))
	require.NoError(e.t, tx.Commit(ctx))
	for _, ev := range evs {
		ids = append(ids, ev.MessageID)
	}
	return ids, xid
}

func (e *env) walLSN() string {
	e.t.Helper()
	var lsn string
	require.NoError(e.t, e.pg.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
	return lsn
}

// commitLSN is where the commit record of transaction xid starts, found
// with pg_walinspect in the WAL written since from.
func (e *env) commitLSN(from, xid string) string {
	e.t.Helper()
	ctx := context.Background()
	_, err := e.pg.Pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	require.NoError(e.t, err)
	var lsn string
	require.NoError(e.t, e.pg.Pool.QueryRow(ctx, `SELECT start_lsn::text FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_lsn())
		WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' AND xid::text = $2`, from, xid).Scan(&lsn),
		"the commit record of transaction %s", xid)
	return lsn
}

func (e *env) config(mods ...func(*walrelay.Config)) walrelay.Config {
	cfg := walrelay.Config{
		Pool: e.pg.Pool, Broker: e.broker,
		StatsInterval: 50 * time.Millisecond, StandbyRetry: 50 * time.Millisecond,
		RetryBackoff: 20 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
		OutageBackoffMax: 100 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		Logger: e.logger(),
	}
	for _, m := range mods {
		m(&cfg)
	}
	return cfg
}

// run starts a relay until the test ends.
func (e *env) run(cfg walrelay.Config) *walrelay.Relay {
	e.t.Helper()
	r, err := walrelay.New(cfg)
	require.NoError(e.t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	e.t.Cleanup(func() {
		require.NoError(e.t, r.Close())
		require.NoError(e.t, <-done)
	})
	// Events committed before the slot exists are not in it: the writers
	// switch to the WAL mode once a relay made the slot (docs/wal-mode.md).
	// Made, not begun: a slot shows in pg_replication_slots while it is
	// still waiting for the transactions running then to end, and what
	// commits meanwhile is before its start (under load, a test wrote its
	// first events then and waited for them in vain: twice in whole runs).
	e.waitSlot(20 * time.Second)
	return r
}

func (e *env) slotConfirmed() string {
	var s *string
	require.NoError(e.t, e.pg.Pool.QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, walrelay.DefaultSlotName).Scan(&s))
	if s == nil {
		return ""
	}
	return *s
}

func (e *env) count(sql string, args ...any) int {
	var n int
	require.NoError(e.t, e.pg.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func TestRelayPublishesCommittedInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.run(e.config())
	ctx := context.Background()

	var want []string
	want = append(want, e.write(e.event("a", 1), e.event("b", 1))...)
	// A rollback emits nothing.
	tx, err := e.pg.Pool.Begin(ctx)
	require.NoError(t, err)
	rolled := e.event("r", 1)
	require.NoError(t, e.writer.PublishTx(ctx, tx, rolled))
	require.NoError(t, tx.Rollback(ctx))
	want = append(want, e.write(e.event("a", 2))...)
	want = append(want, e.write(e.event("b", 2), e.event("a", 3))...)

	outflowtest.WaitFor(t, 20*time.Second, "every committed event", func() bool { return len(e.broker.ids()) >= len(want) })
	require.Equal(t, want, e.broker.ids(), "commit order, each once, nothing of the rollback")
	m := e.broker.got[0].Message
	require.Equal(t, "order.placed", m.Metadata.Get(events.EventTypeKey))
	require.Equal(t, "a", m.Metadata.Get(events.AggregateIDKey))
	require.Equal(t, "1", m.Metadata.Get(events.AggregateVersionKey))
	require.JSONEq(t, `{"n":1}`, string(m.Payload))
	require.Equal(t, "orders", e.broker.got[0].Topic)

	// The slot is confirmed past them: a new relay publishes nothing again.
	// The peek finds the slot in use while the relay reads it (its own
	// peek, in batches): look again.
	outflowtest.WaitFor(t, 10*time.Second, "the slot confirmed", func() bool {
		var n int
		err := e.pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
			'proto_version', '1', 'publication_names', 'outflow_wal', 'messages', 'true')
			WHERE get_byte(data, 0) = 77 AND position('heartbeat' in encode(data, 'escape')) = 0`, walrelay.DefaultSlotName).Scan(&n)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return false
		}
		require.NoError(t, err)
		return n == 0
	})
}

func TestRefusedMessageParksAndHoldsOnlyItsAggregate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a1, a2, a3 := e.event("a", 1), e.event("a", 2), e.event("a", 3)
	e.broker.setRefused(a2.MessageID)
	reg := prometheus.NewRegistry()
	e.run(e.config(func(c *walrelay.Config) { c.MaxAttempts = 3; c.Registerer = reg }))

	e.write(a1, e.event("b", 1))
	e.write(a2)
	e.write(e.event("b", 2), a3)
	last := e.write(e.event("b", 3))[0]
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the broker got %d messages: %v", len(e.broker.ids()), e.broker.ids())
		}
	})
	outflowtest.WaitFor(t, 20*time.Second, "b's events and a1", func() bool { return e.broker.has(last) && e.broker.has(a1.MessageID) })
	require.False(t, e.broker.has(a3.MessageID), "a3 is held behind a2")
	// a2 and a3 are in the parked table, and the slot moved past them:
	// b flows, nothing of a is read again from the WAL.
	outflowtest.WaitFor(t, 20*time.Second, "a2 parked after MaxAttempts", func() bool {
		return e.count(`SELECT count(*) FROM outbox_wal_parked WHERE message_id = $1 AND parked_at IS NOT NULL AND attempts = 3`, a2.MessageID) == 1
	})
	require.Equal(t, 2, e.count(`SELECT count(*) FROM outbox_wal_parked`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM outbox_wal_parked WHERE message_id = $1 AND attempts = 0`, a3.MessageID))
	outflowtest.WaitFor(t, 10*time.Second, "the parked gauge", func() bool {
		return gauge(reg, "outflow_walrelay_parked") == 1
	})

	// a's later events keep queueing behind it.
	a4 := e.event("a", 4)
	b4 := e.write(a4, e.event("b", 4))
	outflowtest.WaitFor(t, 20*time.Second, "b4", func() bool { return e.broker.has(b4[1]) })
	outflowtest.WaitFor(t, 10*time.Second, "a4 queued behind a2", func() bool { return e.count(`SELECT count(*) FROM outbox_wal_parked`) == 3 })
	require.False(t, e.broker.has(a4.MessageID))

	// The operator fixes the cause and retries: a2, a3, a4 go out in order.
	e.broker.setRefused()
	n, err := walrelay.RetryParked(context.Background(), e.pg.Pool, walrelay.ParkedFilter{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	outflowtest.WaitFor(t, 20*time.Second, "a's held events", func() bool { return e.broker.has(a4.MessageID) })
	var as []string
	for _, m := range e.broker.got {
		if m.AggregateID == "a" {
			as = append(as, m.Message.UUID)
		}
	}
	require.Equal(t, []string{a1.MessageID, a2.MessageID, a3.MessageID, a4.MessageID}, as)
	outflowtest.WaitFor(t, 10*time.Second, "the parked table empty", func() bool { return e.count(`SELECT count(*) FROM outbox_wal_parked`) == 0 })
}

// gauge reads one gauge of reg by name and label pairs; -1 when absent.
func gauge(reg *prometheus.Registry, name string, labels ...string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func TestBrokerOutageIsWaitedOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.run(e.config())
	first := e.write(e.event("a", 1))
	outflowtest.WaitFor(t, 20*time.Second, "the first event", func() bool { return e.broker.has(first[0]) })
	outflowtest.WaitFor(t, 10*time.Second, "the slot confirmed past it", func() bool { return e.slotConfirmed() != "" })
	e.broker.setDown(true)
	var want []string
	from := e.walLSN()
	ids, xid := e.writeXID(e.event("a", 2), e.event("b", 2))
	want = append(want, ids...)
	// The slot may still move past a heartbeat the relay commits before
	// the first of them, never into them: past the start of its commit
	// record, decoding would skip it. (A bound read before writing it was
	// not one: a heartbeat could commit in between, past the bound and
	// rightly confirmed.)
	commit := e.commitLSN(from, xid)
	notPast := func() bool {
		var ok bool
		require.NoError(t, e.pg.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn <= $1::pg_lsn
			FROM pg_replication_slots WHERE slot_name = $2`, commit, walrelay.DefaultSlotName).Scan(&ok))
		return ok
	}
	for v := int64(3); v <= 6; v++ {
		want = append(want, e.write(e.event("a", v), e.event("b", v))...)
	}
	outflowtest.WaitFor(t, 20*time.Second, "several tries during the outage", func() bool {
		require.True(t, notPast(), "the slot does not move past what the broker did not take")
		return e.broker.offers(want[0]) >= 3
	})
	require.True(t, notPast(), "the slot does not move past what the broker did not take")
	require.Zero(t, e.count(`SELECT count(*) FROM outbox_wal_parked`), "an outage parks nothing")

	e.broker.setDown(false)
	outflowtest.WaitFor(t, 20*time.Second, "every event after the outage", func() bool { return e.broker.has(want[len(want)-1]) })
	require.Equal(t, append(first, want...), e.broker.ids(), "in order, none lost, no attempt counted")
}

func TestLongTransactionDoesNotStall(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.run(e.config())
	ctx := context.Background()

	long, err := e.pg.Pool.Begin(ctx)
	require.NoError(t, err)
	defer long.Rollback(ctx) //nolint:errcheck
	l1 := e.event("long", 1)
	require.NoError(t, e.writer.PublishTx(ctx, long, l1))

	// Transactions that commit while it is open are relayed meanwhile.
	var others []string
	for v := int64(1); v <= 20; v++ {
		others = append(others, e.write(e.event("x", v))...)
	}
	outflowtest.WaitFor(t, 20*time.Second, "the others, with the long transaction open", func() bool { return e.broker.has(others[len(others)-1]) })
	require.False(t, e.broker.has(l1.MessageID))
	require.Equal(t, others, e.broker.ids())

	require.NoError(t, long.Commit(ctx))
	after := e.write(e.event("x", 21))
	outflowtest.WaitFor(t, 20*time.Second, "the long transaction's event, then the next", func() bool { return e.broker.has(after[0]) })
	ids := e.broker.ids()
	require.Equal(t, []string{l1.MessageID, after[0]}, ids[len(ids)-2:], "in commit order")
}

func TestIdleDatabaseReleasesWAL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.run(e.config())
	ctx := context.Background()
	ids := e.write(e.event("a", 1))
	outflowtest.WaitFor(t, 20*time.Second, "the event", func() bool { return e.broker.has(ids[0]) })

	// WAL of other writes, no outbox event: 3 segments' worth.
	_, err := e.pg.Pool.Exec(ctx, `CREATE TABLE busy AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 150000) g`)
	require.NoError(t, err)
	var mark string
	require.NoError(t, e.pg.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&mark))
	outflowtest.WaitFor(t, 30*time.Second, "the slot past the other writes' WAL", func() bool {
		// A checkpoint logs the running transactions, which lets the
		// slot's restart_lsn move.
		_, err := e.pg.Pool.Exec(ctx, `CHECKPOINT`)
		require.NoError(t, err)
		var ok bool
		require.NoError(t, e.pg.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn AND restart_lsn >= $1::pg_lsn
			FROM pg_replication_slots WHERE slot_name = $2`, mark, walrelay.DefaultSlotName).Scan(&ok))
		return ok
	})
}

func TestLostSlotIsLoudAndRecoverable(t *testing.T) {
	t.Parallel()
	e := setup(t, "max_slot_wal_keep_size=1MB", "wal_keep_size=0", "max_wal_size=32MB", "min_wal_size=32MB")
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	cfg := e.config(func(c *walrelay.Config) { c.Registerer = reg })
	r, err := walrelay.New(cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	e.waitSlot(20 * time.Second)
	first := e.write(e.event("a", 1))
	outflowtest.WaitFor(t, 20*time.Second, "the first event", func() bool { return e.broker.has(first[0]) })
	stop()
	require.NoError(t, <-done)

	// The relay is down; events are written and WAL piles up until the
	// slot is invalidated.
	lost := e.write(e.event("a", 2))
	outflowtest.WaitFor(t, 60*time.Second, "the slot invalidated", func() bool {
		_, err := e.pg.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pile (pad text); INSERT INTO pile SELECT repeat('x', 1000) FROM generate_series(1, 3000)`)
		require.NoError(t, err)
		_, err = e.pg.Pool.Exec(ctx, `SELECT pg_switch_wal()`)
		require.NoError(t, err)
		_, err = e.pg.Pool.Exec(ctx, `CHECKPOINT`)
		require.NoError(t, err)
		return e.count(`SELECT count(*) FROM pg_replication_slots WHERE wal_status = 'lost'`) == 1
	})

	// Started again, the relay is loud: Ready fails with ErrSlotLost,
	// the metric says lost, and it does not recreate the slot.
	r2 := e.run(e.config(func(c *walrelay.Config) { c.Registerer = prometheus.NewRegistry() }))
	_ = r2
	r3reg := prometheus.NewRegistry()
	r3 := e.run(e.config(func(c *walrelay.Config) { c.Registerer = r3reg }))
	outflowtest.WaitFor(t, 20*time.Second, "ErrSlotLost", func() bool { return errors.Is(r3.Ready(), walrelay.ErrSlotLost) })
	outflowtest.WaitFor(t, 20*time.Second, "slot_wal_status{lost}", func() bool {
		return gauge(r3reg, "outflow_walrelay_slot_wal_status", "status", "lost") == 1
	})
	outflowtest.WaitFor(t, 20*time.Second, "ErrSlotLost on the other relay too", func() bool { return errors.Is(r2.Ready(), walrelay.ErrSlotLost) })
	require.Equal(t, 1, e.count(`SELECT count(*) FROM pg_replication_slots WHERE wal_status = 'lost'`), "not recreated")
	after := e.write(e.event("b", 1))
	require.False(t, e.broker.has(lost[0]))

	// Recovery records the lost range and the relays resume.
	lr, err := walrelay.RecoverSlot(ctx, e.pg.Pool, walrelay.RecoverConfig{})
	require.NoError(t, err)
	require.Equal(t, "lost", lr.Status)
	var from, to, status string
	require.NoError(t, e.pg.Pool.QueryRow(ctx, `SELECT lost_from::text, lost_to::text, lost_status FROM outbox_wal_slots WHERE slot_name = $1`,
		walrelay.DefaultSlotName).Scan(&from, &to, &status))
	require.Equal(t, lr.From, from)
	require.Equal(t, lr.To, to)
	var lostInRange bool
	require.NoError(t, e.pg.Pool.QueryRow(ctx, `SELECT $1::pg_lsn < $2::pg_lsn`, from, to).Scan(&lostInRange))
	require.True(t, lostInRange)
	_, err = walrelay.RecoverSlot(ctx, e.pg.Pool, walrelay.RecoverConfig{})
	require.ErrorIs(t, err, walrelay.ErrSlotNotLost)

	outflowtest.WaitFor(t, 20*time.Second, "ready again", func() bool { return r3.Ready() == nil })
	next := e.write(e.event("b", 2))
	outflowtest.WaitFor(t, 20*time.Second, "events after the recovery", func() bool { return e.broker.has(next[0]) })
	require.False(t, e.broker.has(after[0]), "written before the new slot: in the recorded range")

	// A slot the relay recorded that is dropped is lost too ("missing").
	_, err = e.pg.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active_pid IS NOT NULL`)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 20*time.Second, "the slot dropped", func() bool {
		_, err := e.pg.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, walrelay.DefaultSlotName)
		return err == nil
	})
	outflowtest.WaitFor(t, 20*time.Second, "missing", func() bool {
		return errors.Is(r3.Ready(), walrelay.ErrSlotLost) && strings.Contains(r3.Ready().Error(), "missing") &&
			gauge(r3reg, "outflow_walrelay_slot_wal_status", "status", "missing") == 1
	})
	require.Zero(t, e.count(`SELECT count(*) FROM pg_replication_slots`), "not recreated")
}

func TestHistoryIsReplayable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.run(e.config())
	var want []string
	for v := int64(1); v <= 3; v++ {
		want = append(want, e.write(e.event("a", v), e.event("b", v))...)
	}
	outflowtest.WaitFor(t, 20*time.Second, "every event", func() bool { return len(e.broker.ids()) >= len(want) })
	// Written while the broker publishes, committed before the slot moves.
	outflowtest.WaitFor(t, 10*time.Second, "the history", func() bool {
		return e.count(`SELECT count(DISTINCT message_id) FROM outbox_wal_history`) == len(want)
	})

	again := newMemBroker()
	n, err := walrelay.ReplayHistory(context.Background(), e.pg.Pool, again, walrelay.HistoryFilter{})
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.Equal(t, want, again.ids(), "the history replays in commit order")
	for i, m := range again.got {
		orig := e.broker.got[i]
		require.Equal(t, orig.Topic, m.Topic)
		require.Equal(t, string(orig.Message.Payload), string(m.Message.Payload))
		require.Equal(t, orig.Message.Metadata, m.Message.Metadata, "byte for byte the message first published")
	}
	only := newMemBroker()
	n, err = walrelay.ReplayHistory(context.Background(), e.pg.Pool, only, walrelay.HistoryFilter{AggregateID: "b"})
	require.NoError(t, err)
	require.Equal(t, 3, n)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := walrelay.New(walrelay.Config{})
	require.ErrorContains(t, err, "Pool: is required")
	require.ErrorContains(t, err, "Broker: is required")
}

// A parked event an operator discards goes out as its discard marker, as
// in table mode, and its aggregate's held events follow it.
func TestDiscardParkedPublishesTheMarker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a1, a2, a3 := e.event("a", 1), e.event("a", 2), e.event("a", 3)
	e.broker.setRefused(a2.MessageID)
	e.run(e.config(func(c *walrelay.Config) { c.MaxAttempts = 1 }))
	e.write(a1)
	e.write(a2, a3)
	outflowtest.WaitFor(t, 20*time.Second, "a2 parked", func() bool {
		return e.count(`SELECT count(*) FROM outbox_wal_parked WHERE message_id = $1 AND parked_at IS NOT NULL`, a2.MessageID) == 1
	})
	e.broker.setRefused()
	n, err := walrelay.DiscardParked(context.Background(), e.pg.Pool, walrelay.ParkedFilter{Topic: "orders"})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	outflowtest.WaitFor(t, 20*time.Second, "the marker and a3", func() bool { return e.broker.has(a3.MessageID) })
	require.Equal(t, []string{a1.MessageID, a2.MessageID, a3.MessageID}, e.broker.ids())
	marker := e.broker.got[1].Message
	require.Equal(t, events.EventTypeDiscarded, marker.Metadata.Get(events.EventTypeKey))
	require.Equal(t, "order.placed", marker.Metadata.Get(events.DiscardedEventTypeKey))
	require.Equal(t, "{}", string(marker.Payload))
}

// On a PostgreSQL before 17 a failover slot is refused, saying why, and
// Ready reports it; nothing is created. From 17 on (the test's server is
// the installed PostgreSQL) the slot is created with failover on.
func TestFailoverSlotNeedsPostgreSQL17(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var version int
	require.NoError(t, e.pg.Pool.QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int`).Scan(&version))
	r, err := walrelay.New(e.config(func(c *walrelay.Config) { c.FailoverSlot = true }))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })
	if version >= 170000 {
		outflowtest.WaitFor(t, 20*time.Second, "a failover slot", func() bool {
			return e.count(`SELECT count(*) FROM pg_replication_slots WHERE failover`) == 1
		})
		return
	}
	outflowtest.WaitFor(t, 20*time.Second, "the refusal", func() bool {
		return errors.Is(r.Ready(), walrelay.ErrFailoverUnsupported)
	})
	require.Zero(t, e.count(`SELECT count(*) FROM pg_replication_slots`))
}

// waitSlot waits, up to within, until the relay has made its slot and
// confirmed a position in it: from then on every commit is after the
// slot's start and reaches the relay.
func (e *env) waitSlot(within time.Duration) {
	e.t.Helper()
	outflowtest.WaitFor(e.t, within, "the slot", func() bool {
		return e.count(`SELECT count(*) FROM pg_replication_slots WHERE confirmed_flush_lsn IS NOT NULL`) == 1
	})
}
