package redis_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// ownRedis starts a redis-server of the test's own (the shared one is
// never flushed) and returns a client on it.
func ownRedis(t *testing.T) (*testservers.RedisServer, *redis.Client) {
	t.Helper()
	srv := testservers.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// restartEmpty restarts srv without its data, as a Redis without
// persistence (or whose append-only file was lost) comes back.
func restartEmpty(t *testing.T, srv *testservers.RedisServer, c *redis.Client) {
	t.Helper()
	dir, err := c.ConfigGet(context.Background(), "dir").Result()
	require.NoError(t, err)
	srv.Stop()
	require.NoError(t, os.RemoveAll(filepath.Join(dir["dir"], "appendonlydir")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir["dir"], "dump.rdb")))
	srv.Start()
}

// The Auditor contract, on a primary and its replica of the test's own,
// reached through a proxy: a failover is the replica (paused, so behind)
// promoted and the proxy pointed at it, as a virtual IP would move.
func TestAuditContract(t *testing.T) {
	t.Parallel()
	brokertest.RunAudit(t, brokertest.AuditHarness{
		Parallel: true, // each subtest on a server of its own
		Open: func(t *testing.T) brokertest.AuditTarget {
			pair := testservers.StartRedisPair(t)
			proxy := testservers.StartProxy(t, pair.Primary.Addr)
			url := "redis://" + proxy.Addr + "/0"
			b := openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2, Redis: brokers.RedisConfig{URL: url}})
			c := redis.NewClient(&redis.Options{Addr: proxy.Addr})
			t.Cleanup(func() { c.Close() })
			return brokertest.AuditTarget{
				Backend: b,
				Lose: func(t *testing.T, topic string) {
					require.NoError(t, c.FlushAll(context.Background()).Err())
				},
				HoldBack: func(t *testing.T, topic string) func() {
					pair.HoldReplication()
					return func() {
						pair.FailOver()
						proxy.Retarget(pair.Replica.Addr)
					}
				},
				Delete: func(t *testing.T, receipts []forwarder.Receipt) {
					for _, r := range receipts {
						require.NoError(t, c.XDel(context.Background(), r.BrokerTopic, r.Position).Err())
					}
				},
			}
		},
	})
}

// checked is a stream under audit in the tests below: one Check at a time,
// its state kept as the forwarder keeps it.
type checked struct {
	t      *testing.T
	c      *redis.Client
	b      *redisstreams.Broker
	stream string
	state  []byte
	held   []forwarder.Held
}

func newChecked(t *testing.T, c *redis.Client) *checked {
	b, err := redisstreams.New(redisstreams.Config{Client: c})
	require.NoError(t, err)
	return &checked{t: t, c: c, b: b, stream: "orders"}
}

// publish publishes n entries and holds their receipts.
func (a *checked) publish(n int) []forwarder.Held {
	a.t.Helper()
	msgs := make([]forwarder.Outgoing, n)
	for i := range msgs {
		ev, err := events.New(context.Background(), events.Aggregate{Type: "order", ID: watermill.NewShortUUID(), Version: 1}, placed{})
		require.NoError(a.t, err)
		m, err := ev.Message(context.Background())
		require.NoError(a.t, err)
		msgs[i] = forwarder.Outgoing{Topic: a.stream, AggregateID: ev.AggregateID, Message: m}
	}
	receipts, errs := a.b.PublishReceipts(context.Background(), msgs)
	out := make([]forwarder.Held, n)
	for i := range msgs {
		require.NoError(a.t, errs[i])
		out[i] = forwarder.Held{Position: receipts[i].Position, MessageID: msgs[i].Message.UUID}
	}
	a.held = append(a.held, out...)
	return out
}

// check checks every held entry, keeps the state and the unsettled ones,
// and returns the verdict.
func (a *checked) check() forwarder.Verdict {
	a.t.Helper()
	v, err := a.b.Check(context.Background(), a.stream, a.state, a.held, false)
	require.NoError(a.t, err)
	a.state = v.State
	var keep []forwarder.Held
	for i, s := range v.Status {
		if s == forwarder.Unsettled {
			keep = append(keep, a.held[i])
		}
	}
	a.held = keep
	return v
}

// readAck reads every new entry in group and acknowledges all but keep.
func (a *checked) readAck(group string, keep int) {
	a.t.Helper()
	ctx := context.Background()
	err := a.c.XGroupCreateMkStream(ctx, a.stream, group, "0").Err()
	if err != nil && err.Error() != "BUSYGROUP Consumer Group name already exists" {
		require.NoError(a.t, err)
	}
	res, err := a.c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{a.stream, ">"}, Count: 1000, Block: -1}).Result()
	require.NoError(a.t, err)
	msgs := res[0].Messages
	for _, m := range msgs[:len(msgs)-keep] {
		require.NoError(a.t, a.c.XAck(ctx, a.stream, group, m.ID).Err())
	}
}

type placed struct{}

func (placed) EventType() string { return "order.placed" }

func count(status []forwarder.Status, s forwarder.Status) int {
	n := 0
	for _, x := range status {
		if x == s {
			n++
		}
	}
	return n
}

// A restart without persistence, with new entries written after it: the
// entries before are lost, the canary with them.
func TestCheckFindsARestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	srv, c := ownRedis(t)
	a := newChecked(t, c)
	a.publish(5)
	require.Zero(t, count(a.check().Status, forwarder.Lost))
	restartEmpty(t, srv, c)
	a.publish(3)
	v := a.check()
	require.Equal(t, 5, count(v.Status, forwarder.Lost), v.Reason)
	require.Contains(t, v.Reason, "canary")
	require.Zero(t, count(a.check().Status, forwarder.Lost), "the entries after the restart are there")
}

// An entry deleted (XDEL) before its group acknowledged it is lost to that
// group; one deleted after every group had it is not.
func TestCheckTellsADeletionOfUnacknowledgedEntries(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	a := newChecked(t, c)
	held := a.publish(4)
	require.Zero(t, count(a.check().Status, forwarder.Lost)) // an audit ran: the canary
	a.readAck("g", 2)                                        // the first two acknowledged, the last two pending
	require.NoError(t, c.XDel(context.Background(), a.stream, held[0].Position, held[3].Position).Err())
	v := a.check()
	require.Equal(t, []forwarder.Status{forwarder.Settled, forwarder.Settled, forwarder.Unsettled, forwarder.Lost}, v.Status, v.Reason)
	require.Contains(t, v.Reason, "deleted before group g acknowledged it")
}

// Check trims what it settled, and only that: entries pending in a group,
// and those above them, stay. It decides the trim and the next Check
// applies it, once the verdict that accounts for it is committed.
func TestCheckTrimsWhatItSettled(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	a := newChecked(t, c)
	held := a.publish(6)
	a.readAck("g", 3)
	v := a.check()
	require.Equal(t, 3, count(v.Status, forwarder.Settled))
	require.EqualValues(t, 6, xlen(t, c, a.stream), "nothing trimmed before the verdict is committed")
	a.check()
	first, err := c.XRange(context.Background(), a.stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, first, 3, "the settled entries are trimmed, the pending ones kept")
	require.Equal(t, held[3].Position, first[0].ID)
}

// An audit that rolls back after a Check (a shutdown, a PostgreSQL error)
// leaves its receipts and the previous state: the next Check is handed the
// same as the first. Had the first trimmed what it settled, the second
// would take those entries for lost.
func TestCheckAfterARolledBackAuditFindsNoLoss(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	a := newChecked(t, c)
	a.publish(2)
	a.check()
	held := a.publish(6)
	a.readAck("g", 0)
	state := a.state
	for range 3 {
		v, err := a.b.Check(context.Background(), a.stream, state, held, false)
		require.NoError(t, err)
		require.Zero(t, count(v.Status, forwarder.Lost), v.Reason)
		require.Equal(t, len(held), count(v.Status, forwarder.Settled))
	}
}

// With partial (the forwarder holds receipts it did not hand over), Check
// removes nothing: an entry it was not shown may be below its bound.
func TestCheckPartialTrimsNothing(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	a := newChecked(t, c)
	held := a.publish(4)
	a.readAck("g", 0)
	for range 2 {
		v, err := a.b.Check(context.Background(), a.stream, a.state, held, true)
		require.NoError(t, err)
		require.Equal(t, len(held), count(v.Status, forwarder.Settled))
		a.state = v.State
	}
	require.EqualValues(t, 4, xlen(t, c, a.stream))
}

// A deletion of acknowledged entries racing the look: the group
// acknowledges the entries and they are XDELed after the Check read the
// groups' floors and before it looks for them. Read after the look, the
// floors and max-deleted-entry-id show a deletion of acknowledged entries;
// read before it, the entries looked lost.
func TestCheckIgnoresADeletionDuringItsLook(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	a := newChecked(t, c)
	a.publish(2)
	require.Zero(t, count(a.check().Status, forwarder.Lost)) // the canary
	held := a.publish(4)
	a.readAck("g", 4) // delivered, pending
	redisstreams.SetAuditHook(a.b, func() {
		ctx := context.Background()
		for _, h := range held {
			require.NoError(t, c.XAck(ctx, a.stream, "g", h.Position).Err())
			require.NoError(t, c.XDel(ctx, a.stream, h.Position).Err())
		}
	})
	v := a.check()
	require.Zero(t, count(v.Status, forwarder.Lost), v.Reason)
}

func xlen(t *testing.T, c *redis.Client, stream string) int64 {
	t.Helper()
	n, err := c.XLen(context.Background(), stream).Result()
	require.NoError(t, err)
	return n
}

// The subscriber meets the loss too: its stream and group are gone (it was
// blocked reading, woken with UNBLOCKED, then NOGROUP). It creates its
// group again and reads what is published after.
func TestSubscriberSurvivesAFlush(t *testing.T) {
	t.Parallel()
	srv, c := ownRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: c}, watermill.NopLogger{})
	require.NoError(t, err)
	sub, err := redisstreams.NewSubscriber(redisstreams.SubscriberConfig{Client: c, ConsumerGroup: "g", Consumer: "c", BlockTime: 5 * time.Second})
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	receive := func(want string) {
		t.Helper()
		for {
			select {
			case m := <-msgs:
				m.Ack()
				if m.UUID == want {
					return
				}
			case <-ctx.Done():
				t.Fatalf("message %s never received", want)
			}
		}
	}
	send := func() string {
		t.Helper()
		m := message.NewMessage(watermill.NewUUID(), []byte("{}"))
		require.NoError(t, pub.Publish("orders", m))
		return m.UUID
	}
	receive(send())
	require.NoError(t, c.FlushAll(ctx).Err()) // the subscriber is blocked in a read
	receive(send())
	restartEmpty(t, srv, c)
	receive(send())
}
