package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// One three-primary Cluster for the subtests, which run in order: six
// redis-server processes are the cost.
func TestCluster(t *testing.T) {
	t.Parallel()
	cluster := testservers.StartRedisCluster(t)
	cc := cluster.Client()
	ctx := context.Background()
	const topic, partitions = "payments", 6
	seed := "redis://" + cluster.Nodes[0].Addr // one node, no addr=

	t.Run("URL", func(t *testing.T) {
		_, err := redisstreams.NewClient(ctx, seed)
		require.ErrorIs(t, err, redisstreams.ErrClusterNotConfigured, "one Cluster node named as a single server")
		require.ErrorContains(t, err, "--redis-cluster")
		for _, tt := range []struct{ url, want string }{
			{seed + "/3", "database 0 only"},
			{"redis://127.0.0.1:1?master_name=m", "Sentinel"},
			{"unix:///tmp/redis.sock", "unix://"},
		} {
			_, err := redisstreams.NewClusterClient(ctx, tt.url)
			require.ErrorContains(t, err, tt.want, tt.url)
		}
		// One seed is enough with the Cluster option: the client learns the
		// others, and a stream on any primary takes writes.
		b := openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: partitions,
			Redis: brokers.RedisConfig{URL: seed, Cluster: true, StreamPrefix: "url:"}})
		requirePublished(t, b.Broker().Publish(ctx, batch(topic, 30)))
	})

	t.Run("PartitionsSpreadOverPrimaries", func(t *testing.T) {
		b := openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: partitions,
			Redis: brokers.RedisConfig{URL: cluster.URL}})
		byPrimary := map[string][]string{}
		for _, s := range b.Topics(topic) {
			node, err := cc.MasterForKey(ctx, s)
			require.NoError(t, err)
			byPrimary[node.Options().Addr] = append(byPrimary[node.Options().Addr], s)
		}
		t.Logf("streams by primary: %v", byPrimary)
		require.Greater(t, len(byPrimary), 1, "%d partitions of %q on one primary", partitions, topic)
	})

	t.Run("PublishSubscribeLagTrimPing", func(t *testing.T) {
		b := openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: partitions,
			Redis: brokers.RedisConfig{URL: cluster.URL, StreamPrefix: "pipe:", WaitReplicas: 1}})
		msgs := batch(topic, 60)
		requirePublished(t, b.Broker().Publish(ctx, msgs))
		lagger := b.(brokers.LagReporter)
		lag, err := lagger.Lag(ctx, "g", topic)
		require.NoError(t, err)
		require.EqualValues(t, len(msgs), lag.Events, "a group not created yet lags by every stream's entries")

		sub, err := b.Subscriber("g", "c1", brokers.SubscriberOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { sub.Close() })
		got := make(chan *message.Message)
		for _, s := range b.Topics(topic) {
			ch, err := sub.Subscribe(ctx, s)
			require.NoError(t, err)
			go func() {
				for m := range ch {
					got <- m
				}
			}()
		}
		seen := map[string]bool{}
		deadline := time.After(30 * time.Second)
		for len(seen) < len(msgs) {
			select {
			case m := <-got:
				seen[m.UUID] = true
				m.Ack()
			case <-deadline:
				t.Fatalf("received %d of %d messages", len(seen), len(msgs))
			}
		}
		outflowtest.WaitFor(t, 10*time.Second, "no lag once every message is acked", func() bool {
			lag, err := lagger.Lag(ctx, "g", topic)
			require.NoError(t, err)
			return lag.Events == 0
		})
		_, err = b.(brokers.TopicTrimmer).TrimTopic(ctx, topic)
		require.NoError(t, err)
		require.NoError(t, b.(brokers.Pinger).Ping(ctx))
	})

	// WAIT goes to each primary that took writes: with the replica of one
	// primary down, the entries on that primary's streams are reported
	// unpublished and the others published.
	t.Run("WaitPerPrimary", func(t *testing.T) {
		b := openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: partitions,
			Redis: brokers.RedisConfig{URL: cluster.URL, StreamPrefix: "wait:", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond}})
		broker := redisstreams.BrokerOf(b)
		msgs := batch(topic, 60)
		requirePublished(t, b.Broker().Publish(ctx, msgs))

		primary := cluster.PrimaryOf(broker.Stream(topic, msgs[0].AggregateID))
		replica := cluster.ReplicaOf(primary)
		cluster.Nodes[replica].Kill()
		errs := b.Broker().Publish(ctx, msgs)
		var short, published int
		for i, m := range msgs {
			onIt := cluster.PrimaryOf(broker.Stream(topic, m.AggregateID)) == primary
			if onIt {
				require.ErrorIs(t, errs[i], redisstreams.ErrTooFewReplicas, "message %d, on the primary whose replica is down", i)
				require.ErrorIs(t, errs[i], forwarder.ErrBrokerUnavailable)
				short++
			} else {
				require.NoError(t, errs[i], "message %d, on a primary whose replica runs", i)
				published++
			}
		}
		require.NotZero(t, short)
		require.NotZero(t, published)

		cluster.Start(replica)
		requirePublished(t, b.Broker().Publish(ctx, msgs))
	})
}

func batch(topic string, n int) []forwarder.Outgoing {
	out := make([]forwarder.Outgoing, n)
	for i := range out {
		out[i] = forwarder.Outgoing{Topic: topic, AggregateID: fmt.Sprint("agg-", i),
			Message: message.NewMessage(watermill.NewUUID(), []byte(`{}`))}
	}
	return out
}

func requirePublished(t *testing.T, errs []error) {
	t.Helper()
	require.NoError(t, errors.Join(errs...))
}
