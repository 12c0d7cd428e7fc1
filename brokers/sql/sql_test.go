package sql_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	_ "github.com/outflow-dev/outflow/brokers/sql"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openSQLBackend(t *testing.T, url string, cfg brokers.SQLConfig) brokers.Backend {
	t.Helper()
	cfg.DatabaseURL = url
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.SQL, SQL: cfg, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func outgoing(topic string, n, from int) []forwarder.Outgoing {
	out := make([]forwarder.Outgoing, n)
	for i := range out {
		m := message.NewMessage(fmt.Sprintf("00000000-0000-0000-0000-%012d", from+i), []byte(fmt.Sprintf(`{"n":%d}`, from+i)))
		m.Metadata.Set("n", fmt.Sprint(from+i))
		out[i] = forwarder.Outgoing{Topic: topic, AggregateID: "a", Message: m}
	}
	return out
}

// consume reads n messages of topic as group, acking each, and returns
// their "n" metadata in delivery order.
func consume(t *testing.T, b brokers.Backend, group, topic string, n int) []string {
	t.Helper()
	sub, err := b.Subscriber(group, "c1", brokers.SubscriberOptions{InFlight: 10, ClaimIdle: 5 * time.Second})
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), b.Topics(topic)[0])
	require.NoError(t, err)
	var got []string
	timeout := time.After(20 * time.Second)
	for len(got) < n {
		select {
		case m := <-ch:
			got = append(got, m.Metadata.Get("n"))
			m.Ack()
		case <-timeout:
			t.Fatalf("%s: %d of %d messages", group, len(got), n)
		}
	}
	return got
}

// A batch over two topics goes in one transaction, each topic's rows in
// order; every consumer group reads all of its topic, in order.
func TestSQLPublishAndConsumeInOrderPerGroup(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{TablePrefix: "t_"})
	require.Equal(t, []string{"t_orders"}, b.Topics("orders"))
	var batch []forwarder.Outgoing
	for i := range 10 { // interleaved topics
		batch = append(batch, outgoing("orders", 1, i)...)
		batch = append(batch, outgoing("refunds", 1, 100+i)...)
	}
	for _, err := range b.Broker().Publish(context.Background(), batch) {
		require.NoError(t, err)
	}
	for _, err := range b.Broker().Publish(context.Background(), outgoing("orders", 5, 10)) {
		require.NoError(t, err)
	}
	want := make([]string, 15)
	for i := range want {
		want[i] = fmt.Sprint(i)
	}
	require.Equal(t, want, consume(t, b, "g1", "orders", 15))
	require.Equal(t, want, consume(t, b, "g2", "orders", 15))
	require.Len(t, consume(t, b, "g1", "refunds", 10), 10)

	var xids int
	require.NoError(t, s.Pool.QueryRow(context.Background(),
		`SELECT count(DISTINCT transaction_id) FROM (SELECT transaction_id FROM "watermill_t_orders"
		 UNION ALL SELECT transaction_id FROM "watermill_t_refunds") m`).Scan(&xids))
	require.Equal(t, 2, xids, "one transaction per Publish, over its topics")
}

// A topic that cannot name a table fails its own rows only, and not as an
// outage; the others of the batch go through.
func TestSQLBadTopicFailsItsRowsOnly(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{})
	batch := append(outgoing("ok", 2, 0), outgoing("bad topic;", 1, 2)...)
	batch = append(batch, outgoing("x123456789x123456789x123456789x123456789x123456789", 1, 3)...)
	errs := b.Broker().Publish(context.Background(), batch)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for _, err := range errs[2:] {
		require.Error(t, err)
		require.NotErrorIs(t, err, forwarder.ErrBrokerUnavailable)
	}
}

// A row the database refuses (a message id over the uuid column's 36
// characters) fails alone: the batch is retried row by row.
func TestSQLRefusedRowFailsAlone(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{})
	batch := outgoing("ok", 3, 0)
	batch[1].Message.UUID = "this-id-is-far-longer-than-thirty-six-characters"
	errs := b.Broker().Publish(context.Background(), batch)
	require.NoError(t, errs[0])
	require.Error(t, errs[1])
	require.NotErrorIs(t, errs[1], forwarder.ErrBrokerUnavailable)
	require.NoError(t, errs[2])
	require.Equal(t, []string{"0", "2"}, consume(t, b, "g", "ok", 2))
}

// The database gone after Open: Publish reports an outage.
func TestSQLPublishAfterCloseIsUnavailable(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{})
	require.NoError(t, b.Close())
	for _, err := range b.Broker().Publish(context.Background(), outgoing("ok", 2, 0)) {
		require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
	}
}

// Instances creating one topic's tables at once do not race.
func TestSQLConcurrentFirstUse(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8*3)
	for i := range 8 {
		b := openSQLBackend(t, s.URL, brokers.SQLConfig{MaxConns: 4})
		wg.Go(func() {
			for _, err := range b.Broker().Publish(context.Background(), outgoing("fresh", 3, 3*i)) {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM "watermill_fresh"`).Scan(&n))
	require.Equal(t, 24, n)
}

// Subscriptions that would exhaust the pool fail at Subscribe instead of
// hanging.
func TestSQLSubscriptionsBoundedByPool(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{MaxConns: 2})
	sub1, err := b.Subscriber("g1", "c", brokers.SubscriberOptions{})
	require.NoError(t, err)
	_, err = sub1.Subscribe(context.Background(), "a")
	require.NoError(t, err)
	sub2, err := b.Subscriber("g2", "c", brokers.SubscriberOptions{})
	require.NoError(t, err)
	_, err = sub2.Subscribe(context.Background(), "a")
	require.ErrorContains(t, err, "MaxConns")
	require.NoError(t, sub2.Close())
	require.NoError(t, sub1.Close())
	sub3, err := b.Subscriber("g3", "c", brokers.SubscriberOptions{})
	require.NoError(t, err)
	_, err = sub3.Subscribe(context.Background(), "a")
	require.NoError(t, err, "closed subscriptions free their connection")
	require.NoError(t, sub3.Close())
}

// Two instances of one group: the second is a standby blocked on the
// group's lock; closing it returns promptly, and it loses nothing.
func TestSQLStandbyClosesPromptly(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{SubscribeBatchSize: 5})
	for _, err := range b.Broker().Publish(context.Background(), outgoing("q", 10, 0)) {
		require.NoError(t, err)
	}
	active, err := b.Subscriber("g", "a", brokers.SubscriberOptions{ClaimIdle: 5 * time.Second})
	require.NoError(t, err)
	ch, err := active.Subscribe(context.Background(), "q")
	require.NoError(t, err)
	first := <-ch // holds the group's row lock until acked
	standby, err := b.Subscriber("g", "b", brokers.SubscriberOptions{})
	require.NoError(t, err)
	_, err = standby.Subscribe(context.Background(), "q")
	require.NoError(t, err)
	// The standby waits on the group's offsets row: a row-lock waiter holds
	// a tuple lock on the table it waits in.
	outflowtest.WaitFor(t, 10*time.Second, "the standby waiting on the group's lock", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			JOIN pg_namespace ns ON ns.oid = c.relnamespace
			WHERE l.locktype = 'tuple' AND ns.nspname = $1`, s.Name).Scan(&n))
		return n > 0
	})
	start := time.Now()
	require.NoError(t, standby.Close())
	require.Less(t, time.Since(start), 3*time.Second)
	first.Ack()
	require.NoError(t, active.Close())
	require.Len(t, consume(t, b, "g", "q", 9), 9, "the rest of the topic after the acked first")
}

// subscribe opens a subscription of group to topic on b.
func subscribe(t *testing.T, b brokers.Backend, group, topic string, opts brokers.SubscriberOptions) <-chan *message.Message {
	t.Helper()
	sub, err := b.Subscriber(group, "c", opts)
	require.NoError(t, err)
	t.Cleanup(func() { sub.Close() })
	ch, err := sub.Subscribe(context.Background(), b.Topics(topic)[0])
	require.NoError(t, err)
	return ch
}

// receive takes n messages from ch without acking them.
func receive(t *testing.T, ch <-chan *message.Message, n int, within time.Duration) []*message.Message {
	t.Helper()
	var got []*message.Message
	timeout := time.After(within)
	for len(got) < n {
		select {
		case m := <-ch:
			got = append(got, m)
		case <-timeout:
			t.Fatalf("%d of %d messages within %s", len(got), n, within)
		}
	}
	return got
}

func noMessage(t *testing.T, ch <-chan *message.Message, what string) {
	t.Helper()
	select {
	case m := <-ch:
		t.Fatalf("%s: got %s (n=%s)", what, m.UUID, m.Metadata.Get("n"))
	case <-time.After(300 * time.Millisecond):
	}
}

// A read is handed over whole, before any ack, so the middleware can share
// one transaction among its messages (watermill-sql's subscriber hands over
// one message per ack); the rows of one aggregate go one at a time, lowest
// version first, each after its predecessor's ack, so that none overtakes
// another, even when the outbox committed them out of order.
func TestSQLReadHandedOverWholeAggregatesInTurn(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{})
	batch := outgoing("q", 10, 0)
	for i, o := range batch {
		// Ten aggregates at version 1, except that rows 2 and 5 are a2's
		// versions 2 and 1.
		agg, version := fmt.Sprint("a", i), "1"
		switch i {
		case 2:
			version = "2"
		case 5:
			agg = "a2"
		}
		o.Message.Metadata.Set("aggregate_type", "payment")
		o.Message.Metadata.Set("aggregate_id", agg)
		o.Message.Metadata.Set("aggregate_version", version)
	}
	for _, err := range b.Broker().Publish(context.Background(), batch) {
		require.NoError(t, err)
	}
	ch := subscribe(t, b, "g", "q", brokers.SubscriberOptions{InFlight: 100, ClaimIdle: 30 * time.Second})
	got := receive(t, ch, 9, 10*time.Second)
	var ns []string
	for _, m := range got {
		ns = append(ns, m.Metadata.Get("n"))
	}
	require.Equal(t, []string{"0", "1", "3", "4", "5", "6", "7", "8", "9"}, ns, "in table order, a2's version 2 held back")
	noMessage(t, ch, "a2's version 2 before version 1 is acked")
	for _, m := range got {
		if m.Metadata.Get("n") != "5" {
			m.Ack()
		}
	}
	noMessage(t, ch, "a2's version 2 before version 1 is acked")
	got[4].Ack()
	require.Equal(t, "2", receive(t, ch, 1, 10*time.Second)[0].Metadata.Get("n"))
}

// The position moves past the longest acked prefix only: what follows an
// unacked message is read again by the next instance.
func TestSQLPositionIsTheAckedPrefix(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{})
	for _, err := range b.Broker().Publish(context.Background(), outgoing("q", 5, 0)) {
		require.NoError(t, err)
	}
	sub, err := b.Subscriber("g", "c", brokers.SubscriberOptions{InFlight: 100, ClaimIdle: 30 * time.Second})
	require.NoError(t, err)
	ch, err := sub.Subscribe(context.Background(), "q")
	require.NoError(t, err)
	got := receive(t, ch, 5, 10*time.Second)
	got[0].Ack()
	got[1].Ack()
	got[3].Ack()
	got[4].Ack()
	require.NoError(t, sub.Close())
	require.Equal(t, []string{"2", "3", "4"}, consume(t, b, "g", "q", 3))
}

// A subscription that finds nothing takes no lock (and so spends no
// transaction id): its group's offsets row is never locked while it polls.
func TestSQLIdlePollsTakeNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{PollInterval: 5 * time.Millisecond})
	scans := func() int64 {
		var n int64
		_, err := s.Pool.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
		require.NoError(t, err)
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0)
			FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'watermill_q'`, s.Name).Scan(&n))
		return n
	}
	require.NoError(t, errors.Join(b.Broker().Publish(ctx, outgoing("q", 1, 0))...))
	require.Len(t, consume(t, b, "g", "q", 1), 1)
	var xmax string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT xmax::text FROM watermill_offsets_q WHERE consumer_group = 'g'`).Scan(&xmax))
	require.NotEqual(t, "0", xmax, "the read locked the row")

	subscribe(t, b, "g", "q", brokers.SubscriberOptions{})
	before := scans()
	outflowtest.WaitFor(t, 20*time.Second, "twenty polls", func() bool { return scans() >= before+20 })
	var after string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT xmax::text FROM watermill_offsets_q WHERE consumer_group = 'g'`).Scan(&after))
	require.Equal(t, xmax, after, "no poll locked the group's row")
}

// A Publish wakes the subscriptions of its topics (one NOTIFY after its
// commit): a message arrives without waiting for the poll interval.
func TestSQLPublishWakesSubscriptions(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{PollInterval: time.Hour})
	other := openSQLBackend(t, s.URL, brokers.SQLConfig{PollInterval: time.Hour}) // another process's forwarder
	ch := subscribe(t, b, "g", "q", brokers.SubscriberOptions{})
	for i := range 3 {
		for _, err := range other.Broker().Publish(context.Background(), outgoing("q", 1, i)) {
			require.NoError(t, err)
		}
		m := receive(t, ch, 1, 10*time.Second)[0]
		require.Equal(t, fmt.Sprint(i), m.Metadata.Get("n"))
		m.Ack()
	}
}

// A read whose messages nobody takes (a router that stopped reading) ends
// at the ack deadline: its open transaction would otherwise hold back the
// rows of every topic of the server for as long as it lasts.
func TestSQLUntakenReadEndsAtTheAckDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{})
	require.NoError(t, errors.Join(b.Broker().Publish(ctx, outgoing("stuck", 1, 0))...))
	subscribe(t, b, "g", "stuck", brokers.SubscriberOptions{ClaimIdle: 500 * time.Millisecond}) // never read
	outflowtest.WaitFor(t, 10*time.Second, "the untaken read holding its group's lock", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			JOIN pg_namespace ns ON ns.oid = c.relnamespace
			WHERE ns.nspname = $1 AND c.relname = 'watermill_offsets_stuck' AND l.mode = 'RowShareLock'`, s.Name).Scan(&n))
		return n > 0
	})
	require.NoError(t, errors.Join(b.Broker().Publish(ctx, outgoing("other", 1, 1))...))
	require.Equal(t, []string{"1"}, consume(t, b, "g", "other", 1))
}

// The contract, on tables in a schema of the test's own; the outage is a
// proxy's in front of PostgreSQL (the broker's connections only).
func TestBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target {
			return brokertest.BackendTarget(t, openSQLBackend(t, outflowtest.NewEmptySchema(t).URL, brokers.SQLConfig{MaxConns: 8}))
		},
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			u, err := url.Parse(outflowtest.NewEmptySchema(t).URL)
			require.NoError(t, err)
			p := testservers.StartProxy(t, u.Host)
			u.Host = p.Addr
			return brokertest.BackendTarget(t, openSQLBackend(t, u.String(), brokers.SQLConfig{MaxConns: 8})), p
		},
	})
}

// Lag and Ping; one aggregate, as the position is the longest acked prefix
// in table order. The outage is a proxy's in front of PostgreSQL.
func TestObserveContract(t *testing.T) {
	t.Parallel()
	brokertest.RunObserve(t, brokertest.ObserveHarness{
		Aggregates: 1,
		Open: func(t *testing.T) brokers.Backend {
			return openSQLBackend(t, outflowtest.NewEmptySchema(t).URL, brokers.SQLConfig{MaxConns: 8})
		},
		Outage: func(t *testing.T) (brokers.Backend, testservers.Outage) {
			u, err := url.Parse(outflowtest.NewEmptySchema(t).URL)
			require.NoError(t, err)
			p := testservers.StartProxy(t, u.Host)
			u.Host = p.Addr
			return openSQLBackend(t, u.String(), brokers.SQLConfig{MaxConns: 8}), p
		},
	})
}

// A group without a position lags by the whole table; no table yet, by
// nothing; asking creates neither the tables nor the group's row.
func TestLagOfAGroupNotSubscribedYet(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{})
	lr := b.(brokers.LagReporter)
	ctx := context.Background()
	lag, err := lr.Lag(ctx, "g", "orders")
	require.NoError(t, err)
	require.Equal(t, brokers.Lag{}, lag)
	var tables int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables))
	require.Zero(t, tables, "Lag created tables")

	require.NoError(t, errors.Join(b.Broker().Publish(ctx, outgoing("orders", 3, 1))...))
	outflowtest.WaitFor(t, 10*time.Second, "3 events lagging, older than 0", func() bool {
		lag, err = lr.Lag(ctx, "g", "orders")
		require.NoError(t, err)
		return lag.Events == 3 && lag.OldestAge > 0
	})
	var groups int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM watermill_offsets_orders`).Scan(&groups))
	require.Zero(t, groups, "Lag created the group's row")
}
