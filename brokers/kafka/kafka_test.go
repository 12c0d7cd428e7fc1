package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	_ "github.com/outflow-dev/outflow/brokers/kafka"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

var kafkaTestLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

func openTestKafka(t *testing.T, addrs []string) brokers.Backend {
	t.Helper()
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.Kafka, Logger: kafkaTestLogger,
		Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPrefix: "t.", TopicPartitions: 4, SessionTimeout: 2 * time.Second,
			TopicCheckInterval: 200 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

func kafkaOutgoing(topic, aggregate string, seq int) forwarder.Outgoing {
	m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(seq)))
	m.Metadata.Set("seq", fmt.Sprint(seq))
	return forwarder.Outgoing{Topic: topic, AggregateID: aggregate, Message: m}
}

// A batch published before any consumer exists is read by a new group from
// the start; each aggregate stays on one partition, in order; the Outflow
// topic's '$' and ':' become '_'.
func TestKafkaBatchKeepsAggregateOrder(t *testing.T) {
	t.Parallel()
	b := openTestKafka(t, testservers.Kafka(t))
	const topic, aggregates, perAggregate = "pay:ments$", 5, 20
	require.Equal(t, []string{"t.pay_ments_"}, b.Topics(topic))

	var msgs []forwarder.Outgoing
	for i := range perAggregate {
		for a := range aggregates {
			msgs = append(msgs, kafkaOutgoing(topic, fmt.Sprint("agg-", a), i))
		}
	}
	start := time.Now()
	for _, err := range b.Broker().Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
	t.Logf("published %d in one batch in %s", len(msgs), time.Since(start).Round(time.Millisecond))

	sub, err := b.Subscriber("g1", "worker:1", brokers.SubscriberOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, b.Topics(topic)[0])
	require.NoError(t, err)

	next := map[string]int{}
	partition := map[string]int32{}
	for range msgs {
		var m *message.Message
		select {
		case m = <-ch:
		case <-ctx.Done():
			t.Fatalf("got %v of %d before the deadline", next, len(msgs))
		}
		key, _ := kafka.MessageKeyFromCtx(m.Context())
		p, _ := kafka.MessagePartitionFromCtx(m.Context())
		agg := string(key)
		if q, ok := partition[agg]; ok {
			require.Equal(t, q, p, "aggregate %s moved partitions", agg)
		}
		partition[agg] = p
		require.Equal(t, fmt.Sprint(next[agg]), m.Metadata.Get("seq"), "aggregate %s out of order", agg)
		next[agg]++
		m.Ack()
	}
	require.Len(t, next, aggregates)
	t.Logf("consumed in %s", time.Since(start).Round(time.Millisecond))
}

// A record over the producer's limit is the row's fault; the others of its
// batch go through.
func TestKafkaMessageTooLargeIsTheRows(t *testing.T) {
	t.Parallel()
	b := openTestKafka(t, testservers.Kafka(t))
	big := kafkaOutgoing("payments", "a", 1)
	big.Message.Payload = []byte(strings.Repeat("x", 2<<20))
	errs := b.Broker().Publish(context.Background(), []forwarder.Outgoing{kafkaOutgoing("payments", "a", 0), big, kafkaOutgoing("payments", "b", 0)})
	require.NoError(t, errs[0])
	require.Error(t, errs[1])
	require.NotErrorIs(t, errs[1], forwarder.ErrBrokerUnavailable)
	require.NoError(t, errs[2])
}

// Once the cluster is gone, publishing fails as the broker's fault, in
// bounded time.
func TestKafkaDownIsBrokerUnavailable(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	require.NoError(t, err)
	b := openTestKafka(t, c.ListenAddrs())
	for _, err := range b.Broker().Publish(context.Background(), []forwarder.Outgoing{kafkaOutgoing("payments", "a", 0)}) {
		require.NoError(t, err)
	}
	c.Close()
	start := time.Now()
	errs := b.Broker().Publish(context.Background(), []forwarder.Outgoing{kafkaOutgoing("payments", "a", 1), kafkaOutgoing("other", "b", 0)})
	for _, err := range errs {
		require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
	}
	require.Less(t, time.Since(start), 15*time.Second)
	t.Logf("failed in %s: %v", time.Since(start).Round(time.Millisecond), errs[0])
}

// kafkaRecords counts the records of a Kafka topic over its partitions.
func kafkaRecords(t *testing.T, addrs []string, topic string) int64 {
	t.Helper()
	c, err := sarama.NewClient(addrs, sarama.NewConfig())
	require.NoError(t, err)
	defer c.Close()
	parts, err := c.Partitions(topic)
	require.NoError(t, err)
	var n int64
	for _, p := range parts {
		off, err := c.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
		n += off
	}
	return n
}

// A publish whose produce request gets no answer times out; it must not
// leave sarama sending that batch in the background: the next publish of
// the same row (the forwarder's next batch) is the only copy written.
func TestKafkaTimedOutPublishStopsSending(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	b := openTestKafka(t, c.ListenAddrs())
	// Create the topic first, so the held request is the produce.
	for _, err := range b.Broker().Publish(context.Background(), []forwarder.Outgoing{kafkaOutgoing("slow", "a", 0)}) {
		require.NoError(t, err)
	}

	// The next produce request is held unanswered until release, then its
	// connection is cut without the records being appended: the broker
	// never got them, and sarama, if still running, sends them again.
	release := make(chan struct{})
	var held atomic.Bool
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !held.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		c.SleepControl(func() { <-release })
		return nil, errors.New("cut"), true
	})
	m := kafkaOutgoing("slow", "a", 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	for _, err := range b.Broker().Publish(ctx, []forwarder.Outgoing{m}) {
		require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
	}
	t.Logf("timed-out publish returned after %s", time.Since(start).Round(time.Millisecond))
	close(release)

	// The forwarder's next batch sends the row again.
	again := kafkaOutgoing("slow", "a", 1)
	again.Message = m.Message.Copy()
	for _, err := range b.Broker().Publish(context.Background(), []forwarder.Outgoing{again}) {
		require.NoError(t, err)
	}
	require.EqualValues(t, 2, kafkaRecords(t, c.ListenAddrs(), "t.slow"),
		"the first record and one copy of the second: the timed-out send was not retried behind the caller's back")
}

// An aborted publish returns soon after its timeout, however many records
// it held: once the client is closed, sarama fails the records still to
// send one at a time, each after its retry backoff (100 ms), which kept
// this 200-record publish 21 s past its 1 s timeout, the forwarder's
// transaction open all along.
func TestKafkaAbortedPublishReturnsPromptly(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	b := openTestKafka(t, c.ListenAddrs())
	for _, err := range b.Broker().Publish(context.Background(), []forwarder.Outgoing{kafkaOutgoing("slow", "a", 0)}) {
		require.NoError(t, err)
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var held atomic.Bool
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !held.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		c.SleepControl(func() { <-release })
		return nil, errors.New("cut"), true
	})
	msgs := make([]forwarder.Outgoing, 200)
	for i := range msgs {
		msgs[i] = kafkaOutgoing("slow", "a", i+1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	for _, err := range b.Broker().Publish(ctx, msgs) {
		require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
	}
	took := time.Since(start)
	t.Logf("aborted publish of %d records returned after %s", len(msgs), took.Round(time.Millisecond))
	require.Less(t, took, 10*time.Second, "the abort waited on sarama's retry backoff")
}

// Kafka refuses a record on its own when it is over its topic's
// max.message.bytes (below the producer's MaxMessageBytes).
func TestBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target {
			addrs := testservers.Kafka(t)
			target := brokertest.BackendTarget(t, openTestKafka(t, addrs)) // topic prefix "t."
			target.Refuse = func(t *testing.T, topic string, bytes int) func() {
				admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
				require.NoError(t, err)
				t.Cleanup(func() { admin.Close() })
				small, big := fmt.Sprint(bytes), "1048588"
				require.NoError(t, admin.CreateTopic("t."+topic, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1,
					ConfigEntries: map[string]*string{"max.message.bytes": &small}}, false))
				return func() {
					require.NoError(t, admin.AlterConfig(sarama.TopicResource, "t."+topic, map[string]*string{"max.message.bytes": &big}, false))
				}
			}
			return target
		},
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			k := testservers.StartKafka(t)
			return brokertest.BackendTarget(t, openTestKafka(t, k.Addrs)), k
		},
	})
}

// Lag and Ping on a 4-partition topic; the outage is a kfake cluster of
// the test's own.
func TestObserveContract(t *testing.T) {
	t.Parallel()
	brokertest.RunObserve(t, brokertest.ObserveHarness{
		CountsUnacked: true,
		Open:          func(t *testing.T) brokers.Backend { return openTestKafka(t, testservers.Kafka(t)) },
		Outage: func(t *testing.T) (brokers.Backend, testservers.Outage) {
			k := testservers.StartKafka(t)
			return openTestKafka(t, k.Addrs), k
		},
	})
}

// A topic not created yet lags by nothing and asking does not create it; a
// group with no committed offset lags by the whole topic.
func TestLagOfAGroupNotSubscribedYet(t *testing.T) {
	t.Parallel()
	addrs := testservers.Kafka(t)
	b := openTestKafka(t, addrs)
	lr := b.(brokers.LagReporter)
	ctx := context.Background()
	lag, err := lr.Lag(ctx, "g", "orders")
	require.NoError(t, err)
	require.Equal(t, brokers.Lag{}, lag)
	admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	topics, err := admin.ListTopics()
	require.NoError(t, err)
	require.NotContains(t, topics, "t.orders", "Lag created the topic")

	var msgs []forwarder.Outgoing
	for i := range 3 {
		msgs = append(msgs, kafkaOutgoing("orders", fmt.Sprint("agg-", i), i))
	}
	for _, err := range b.Broker().Publish(ctx, msgs) {
		require.NoError(t, err)
	}
	outflowtest.WaitFor(t, 10*time.Second, "3 events lagging, older than 0", func() bool {
		lag, err = lr.Lag(ctx, "g", "orders")
		require.NoError(t, err)
		return lag.Events == 3 && lag.OldestAge > 0
	})
}
