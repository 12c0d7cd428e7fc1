package redis_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// ownRedis starts a redis-server of the test's own (the shared one is
// never flushed) and returns a client on it.
func ownRedis(t *testing.T) (*outflowtest.RedisServer, *redis.Client) {
	t.Helper()
	srv := outflowtest.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// restartEmpty restarts srv without its data, as a Redis without
// persistence (or whose append-only file was lost) comes back.
func restartEmpty(t *testing.T, srv *outflowtest.RedisServer, c *redis.Client) {
	t.Helper()
	dir, err := c.ConfigGet(context.Background(), "dir").Result()
	require.NoError(t, err)
	srv.Stop()
	require.NoError(t, os.RemoveAll(filepath.Join(dir["dir"], "appendonlydir")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir["dir"], "dump.rdb")))
	srv.Start()
}

type auditTarget struct {
	t      *testing.T
	c      *redis.Client
	b      *redisstreams.Broker
	stream string
	state  []byte
}

func newAuditTarget(t *testing.T, c *redis.Client) *auditTarget {
	b, err := redisstreams.New(redisstreams.Config{Client: c})
	require.NoError(t, err)
	return &auditTarget{t: t, c: c, b: b, stream: "orders"}
}

// audit runs one audit and keeps its state, as the forwarder does.
func (a *auditTarget) audit() *forwarder.Loss {
	a.t.Helper()
	next, loss, err := a.b.Audit(context.Background(), a.stream, a.state)
	require.NoError(a.t, err)
	require.NotEmpty(a.t, next)
	a.state = next
	return loss
}

func (a *auditTarget) publish(n int) {
	a.t.Helper()
	msgs := make([]forwarder.Outgoing, n)
	for i := range msgs {
		msgs[i] = forwarder.Outgoing{Topic: a.stream, AggregateID: "a", Message: message.NewMessage(watermill.NewUUID(), []byte("{}"))}
	}
	for _, err := range a.b.Publish(context.Background(), msgs) {
		require.NoError(a.t, err)
	}
}

// readAck reads every new entry in group and acknowledges all but keep.
func (a *auditTarget) readAck(group string, keep int) {
	a.t.Helper()
	ctx := context.Background()
	res, err := a.c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{a.stream, ">"}, Count: 10_000}).Result()
	if err == redis.Nil {
		return
	}
	require.NoError(a.t, err)
	msgs := res[0].Messages
	var ids []string
	for _, m := range msgs[:len(msgs)-min(keep, len(msgs))] {
		ids = append(ids, m.ID)
	}
	if len(ids) > 0 {
		require.NoError(a.t, a.c.XAck(ctx, a.stream, group, ids...).Err())
	}
}

func TestAuditFindsAFlush(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	a := newAuditTarget(t, c)
	require.Nil(t, a.audit(), "a baseline of a stream that does not exist yet")
	a.publish(10)
	require.Nil(t, a.audit())
	require.NoError(t, c.XGroupCreate(context.Background(), a.stream, "g", "0").Err())
	a.readAck("g", 3) // three entries unacknowledged: the loss starts at the first of them
	require.Nil(t, a.audit())
	entries, err := c.XRange(context.Background(), a.stream, "-", "+").Result()
	require.NoError(t, err)
	var ms, seq int64
	_, err = fmt.Sscanf(entries[7].ID, "%d-%d", &ms, &seq)
	require.NoError(t, err)
	firstUnacked := time.UnixMilli(ms)

	require.NoError(t, c.FlushAll(context.Background()).Err())
	loss := a.audit()
	require.NotNil(t, loss)
	require.Contains(t, loss.Reason, "canary missing")
	require.Equal(t, firstUnacked, loss.Since, "from the oldest entry a group had not acknowledged")
	require.Nil(t, a.audit(), "the new baseline holds")
}

func TestAuditFindsARestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	srv, c := ownRedis(t)
	a := newAuditTarget(t, c)
	a.publish(5)
	require.Nil(t, a.audit())
	restartEmpty(t, srv, c)
	a.publish(2) // the forwarder went on
	loss := a.audit()
	require.NotNil(t, loss)
	require.Contains(t, loss.Reason, "canary missing")
}

// A failover to a replica that had the canary but not the last entries,
// which then takes more entries than it lacked: entries-added is back where
// it was, the canary is there, the last entry the audit saw is not.
func TestAuditFindsLostEntriesBehindACanary(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	ctx := context.Background()
	a := newAuditTarget(t, c)
	a.publish(10)
	require.Nil(t, a.audit())
	// The replica's copy: the first 7 entries, entries-added 7.
	entries, err := c.XRange(ctx, a.stream, "-", "+").Result()
	require.NoError(t, err)
	require.NoError(t, c.Del(ctx, a.stream).Err())
	for _, e := range entries[:7] {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: a.stream, ID: e.ID, Values: e.Values}).Err())
	}
	entriesAdded := func() int64 {
		info, err := c.XInfoStream(ctx, a.stream).Result()
		require.NoError(t, err)
		return info.EntriesAdded
	}
	require.EqualValues(t, 7, entriesAdded())
	loss := a.audit()
	require.NotNil(t, loss)
	require.Contains(t, loss.Reason, "entries-added went back")

	// The same loss seen only after the new primary took more entries.
	a.publish(10)
	require.Nil(t, a.audit())
	entries, err = c.XRange(ctx, a.stream, "-", "+").Result()
	require.NoError(t, err)
	require.NoError(t, c.Del(ctx, a.stream).Err())
	for _, e := range entries[:len(entries)-3] {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: a.stream, ID: e.ID, Values: e.Values}).Err())
	}
	a.publish(5) // ids after the lost ones
	require.Greater(t, entriesAdded(), int64(len(entries)))
	loss = a.audit()
	require.NotNil(t, loss)
	require.Contains(t, loss.Reason, "missing")
}

// A failover to a replica that lacked only what was written since the last
// audit: entries-added, last-generated-id and the canary are as the audit
// saw them, or ahead once other forwarders write to the new primary. The
// ids Redis acknowledged to this broker since show the loss.
func TestAuditFindsAFailoverLossBetweenAudits(t *testing.T) {
	t.Parallel()
	for _, more := range []int{0, 10} {
		t.Run(fmt.Sprintf("%d entries written to the new primary by others", more), func(t *testing.T) {
			t.Parallel()
			_, c := ownRedis(t)
			ctx := context.Background()
			a := newAuditTarget(t, c)
			a.publish(10)
			require.Nil(t, a.audit())
			replica, err := c.XRange(ctx, a.stream, "-", "+").Result()
			require.NoError(t, err)
			a.publish(5) // acknowledged by the primary, never replicated
			require.NoError(t, c.Del(ctx, a.stream).Err())
			for _, e := range replica {
				require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: a.stream, ID: e.ID, Values: e.Values}).Err())
			}
			for range more {
				require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: a.stream, Values: map[string]any{"x": "y"}}).Err())
			}
			// A pass whose transaction rolls back does not save its state:
			// the next one, from the same state, finds the loss again.
			_, rolledBack, err := a.b.Audit(ctx, a.stream, a.state)
			require.NoError(t, err)
			require.NotNil(t, rolledBack, "the entries acknowledged since the last audit are gone")
			loss := a.audit()
			require.NotNil(t, loss, "found again after a pass that was not saved")
			require.Nil(t, a.audit(), "found once")
		})
	}
}

// Normal trimming, of everything every group acknowledged, rounds after
// rounds, with an audit between each step: never a loss, although the
// last entry an audit saw is trimmed away.
func TestAuditIgnoresNormalTrimming(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	ctx := context.Background()
	// Approximate trimming removes whole radix-tree nodes: small ones here.
	require.NoError(t, c.ConfigSet(ctx, "stream-node-max-entries", "4").Err())
	a := newAuditTarget(t, c)
	a.publish(1)
	require.NoError(t, c.XGroupCreate(ctx, a.stream, "g", "0").Err())
	require.NoError(t, c.XGroupCreate(ctx, a.stream, "h", "0").Err())
	var trimmedLast bool
	for round := range 8 {
		a.publish(20)
		require.Nil(t, a.audit(), "round %d, published", round)
		last := lastID(t, c, a.stream)
		a.readAck("g", round%2) // g keeps one pending every other round
		require.Nil(t, a.audit(), "round %d, g read", round)
		a.readAck("h", 0)
		require.Nil(t, a.audit(), "round %d, h read", round)
		_, err := a.b.TrimTopic(ctx, a.stream)
		require.NoError(t, err)
		require.Nil(t, a.audit(), "round %d, trimmed", round)
		gone, err := c.XRange(ctx, a.stream, last, last).Result()
		require.NoError(t, err)
		trimmedLast = trimmedLast || len(gone) == 0
	}
	require.True(t, trimmedLast, "some audit's last entry was trimmed away")
	n, err := c.XLen(ctx, a.stream).Result()
	require.NoError(t, err)
	require.Less(t, n, int64(1+8*20), "trimming removed entries")
}

// A trim between an audit's two looks: the group reads and acknowledges
// everything and the trimmer removes it, after the audit saw the stream
// and before it looks for the entry it probes. The probe is gone, trimmed
// as it may be: no loss (the first entry and the group's floor seen before
// the trim said it could not have been).
func TestAuditIgnoresATrimBetweenItsLooks(t *testing.T) {
	t.Parallel()
	_, c := ownRedis(t)
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "stream-node-max-entries", "4").Err())
	a := newAuditTarget(t, c)
	a.publish(1)
	require.NoError(t, c.XGroupCreate(ctx, a.stream, "g", "0").Err())
	a.publish(20)
	require.Nil(t, a.audit(), "the baseline")
	probe := lastID(t, c, a.stream)
	a.publish(20)
	redisstreams.SetAuditHook(a.b, func() {
		redisstreams.SetAuditHook(a.b, nil)
		a.readAck("g", 0)
		_, err := a.b.TrimTopic(ctx, a.stream)
		require.NoError(t, err)
	})
	require.Nil(t, a.audit(), "trimmed, not lost")
	gone, err := c.XRange(ctx, a.stream, probe, probe).Result()
	require.NoError(t, err)
	require.Empty(t, gone, "the entry the audit looked for was trimmed in between")
}

func lastID(t *testing.T, c *redis.Client, stream string) string {
	t.Helper()
	info, err := c.XInfoStream(context.Background(), stream).Result()
	require.NoError(t, err)
	return info.LastGeneratedID
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
