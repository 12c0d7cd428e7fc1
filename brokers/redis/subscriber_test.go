package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Watermill's universal Pub/Sub suite, with the features the batch
// subscriber honestly has: consumer groups, persistence, old messages for a
// new group; no order (a read is handled concurrently, a nacked message
// comes back after the others) and no exactly-once (that is the
// idempotency middleware's job). Publishing is watermill-redisstream's
// publisher: the forwarder writes the same entries.
func TestSubscriberUniversalSuite(t *testing.T) {
	client := testservers.Redis(t)
	prefix := testservers.UniqueName(t, client) // streams deleted when the suite ends
	features := tests.Features{
		ConsumerGroups:                   true,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: true,
		GenerateTopicFunc: func(tctx tests.TestContext) string {
			return prefix + "_" + string(tctx.TestID) + "_" + watermill.NewShortUUID()
		},
	}
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		// Clients of their own: blocking reads hold a connection each, and
		// the suite runs many subscribers and publishers at once.
		pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: testservers.Redis(t)}, watermill.NopLogger{})
		require.NoError(t, err)
		sub, err := redisstreams.NewSubscriber(redisstreams.SubscriberConfig{
			Client:          testservers.Redis(t),
			ConsumerGroup:   group,
			Consumer:        watermill.NewShortUUID(),
			BlockTime:       50 * time.Millisecond,
			ClaimIdle:       time.Second,
			NackResendSleep: 10 * time.Millisecond,
		})
		require.NoError(t, err)
		return pub, sub
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPubSub(t, watermill.NewShortUUID())
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) { return newPubSub(t, group) })
}

// A read is delivered at once: every message of it is in flight before the
// first is acked, which is what lets the middleware share transactions.
func TestSubscriberDeliversAReadAtOnce(t *testing.T) {
	t.Parallel()
	client := testservers.Redis(t)
	stream := testservers.UniqueName(t, client)
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
	require.NoError(t, err)
	for range 10 {
		require.NoError(t, pub.Publish(stream, message.NewMessage(watermill.NewUUID(), []byte("x"))))
	}
	sub, err := redisstreams.NewSubscriber(redisstreams.SubscriberConfig{Client: client, ConsumerGroup: "g", Consumer: "c", BatchSize: 10})
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, stream)
	require.NoError(t, err)
	var held []*message.Message
	for range 10 {
		select {
		case m := <-msgs:
			held = append(held, m) // not acked yet
		case <-ctx.Done():
			t.Fatalf("only %d of 10 messages in flight together", len(held))
		}
	}
	for _, m := range held {
		m.Ack()
	}
	outflowtest.WaitFor(t, 5*time.Second, "all acknowledged", func() bool {
		p, err := client.XPending(ctx, stream, "g").Result()
		return err == nil && p.Count == 0
	})
}

// A consumer that dies holding messages: another of its group claims them
// after ClaimIdle; a restarted consumer of the same name gets its own back
// at once.
func TestSubscriberRedeliversUnacked(t *testing.T) {
	t.Parallel()
	client := testservers.Redis(t)
	stream := testservers.UniqueName(t, client)
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, watermill.NopLogger{})
	require.NoError(t, err)
	want := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish(stream, want))

	read := func(consumer string, claimIdle time.Duration) *message.Message {
		sub, err := redisstreams.NewSubscriber(redisstreams.SubscriberConfig{Client: client, ConsumerGroup: "g",
			Consumer: consumer, ClaimIdle: claimIdle, BlockTime: 50 * time.Millisecond})
		require.NoError(t, err)
		defer sub.Close()
		msgs, err := sub.Subscribe(context.Background(), stream)
		require.NoError(t, err)
		select {
		case m := <-msgs:
			return m
		case <-time.After(10 * time.Second):
			t.Fatalf("%s got nothing", consumer)
			return nil
		}
	}
	m := read("dies", time.Hour) // never acked: the subscriber closes with it in flight
	require.Equal(t, want.UUID, m.UUID)
	m = read("dies", time.Hour) // same name: its pending entry first
	require.Equal(t, want.UUID, m.UUID)
	m = read("other", 200*time.Millisecond)
	require.Equal(t, want.UUID, m.UUID, "claimed from the dead consumer")
	m.Ack()
}
