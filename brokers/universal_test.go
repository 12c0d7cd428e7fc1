package brokers_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// suitePublisher publishes through a backend's forwarder side, as the
// forwarder does; the suite's topic is the broker's name for it, prefix
// included.
type suitePublisher struct {
	b      brokers.Backend
	prefix string
	used   func(topic string) // notes the topic, for cleanup; may be nil
}

func (p suitePublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.used != nil {
		p.used(topic)
	}
	out := make([]forwarder.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = forwarder.Outgoing{Topic: strings.TrimPrefix(topic, p.prefix), AggregateID: m.UUID, Message: m}
	}
	for _, err := range p.b.Broker().Publish(context.Background(), out) {
		if err != nil {
			return err
		}
	}
	return nil
}

func (p suitePublisher) Close() error { return nil }

// suiteBackend opens one backend for the suite, isolated by prefix; the
// Config's prefix is returned so topics can be named under it.
type suiteBackend struct {
	kind brokers.Kind
	// open is called once per suite; cfg opens one more instance.
	open func(t *testing.T) (prefix string, cfg func() brokers.Config)
}

var suiteBackends = []suiteBackend{
	{brokers.Redis, func(t *testing.T) (string, func() brokers.Config) {
		prefix := testservers.UniqueName(t, testservers.Redis(t)) + "_"
		return prefix, func() brokers.Config {
			return brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}}
		}
	}},
	{brokers.NATS, func(t *testing.T) (string, func() brokers.Config) {
		prefix := testservers.NATSPrefix(t)
		return prefix, func() brokers.Config {
			return brokers.Config{Kind: brokers.NATS, NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}}
		}
	}},
	{brokers.AMQP, func(t *testing.T) (string, func() brokers.Config) {
		prefix := testservers.AMQPPrefix(t, 1, nil)
		return prefix, func() brokers.Config {
			return brokers.Config{Kind: brokers.AMQP, AMQP: brokers.AMQPConfig{URL: testservers.AMQPURL(), Prefix: prefix,
				Groups: map[string][]string{}, NackDelay: 10 * time.Millisecond}}
		}
	}},
	{brokers.SQL, func(t *testing.T) (string, func() brokers.Config) {
		s := outflowtest.NewEmptySchema(t)
		return "", func() brokers.Config {
			return brokers.Config{Kind: brokers.SQL, SQL: brokers.SQLConfig{DatabaseURL: s.URL, PollInterval: 20 * time.Millisecond, MaxConns: 24}}
		}
	}},
	{brokers.Kafka, func(t *testing.T) (string, func() brokers.Config) {
		addrs := testservers.Kafka(t)
		return "", func() brokers.Config {
			return brokers.Config{Kind: brokers.Kafka, Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPartitions: 4}}
		}
	}},
}

// Watermill's universal Pub/Sub suite on every backend's subscriber,
// published through its forwarder side, with the features they honestly
// have: consumer groups, persistence, a new group reads the history (not on
// RabbitMQ, where a group's queue keeps only what arrived after it was
// declared). No order (Redis and NATS hand over a whole fetch at once,
// Kafka partitions and RabbitMQ channels run in parallel) and no
// exactly-once: that is the idempotency middleware's job.
func TestSubscribersUniversalSuite(t *testing.T) {
	for _, sb := range suiteBackends {
		t.Run(string(sb.kind), func(t *testing.T) {
			t.Parallel()
			prefix, cfg := sb.open(t)
			var (
				mu     sync.Mutex
				topics = map[string]bool{}
			)
			used := func(topic string) {
				mu.Lock()
				topics[topic] = true
				mu.Unlock()
			}
			if sb.kind == brokers.AMQP {
				t.Cleanup(func() { deleteAMQP(topics, "suite") })
			}
			newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
				b, err := brokers.Open(context.Background(), cfg())
				require.NoError(t, err)
				t.Cleanup(func() { b.Close() })
				sub, err := b.Subscriber(group, watermill.NewShortUUID(), brokers.SubscriberOptions{ClaimIdle: 2 * time.Second})
				require.NoError(t, err)
				return suitePublisher{b, prefix, used}, sub
			}
			features := tests.Features{
				ConsumerGroups: true,
				Persistent:     true,
				GenerateTopicFunc: func(tctx tests.TestContext) string {
					return prefix + "s" + strings.ToLower(watermill.NewShortUUID()[:12])
				},
			}
			// A new consumer group reads what was published before it only
			// where the broker keeps messages apart from their consumers.
			features.NewSubscriberReceivesOldMessages = sb.kind != brokers.AMQP
			// The suite's short counts, on every backend: each case's
			// behaviour is the same with fewer messages, and the full
			// counts cost minutes of CPU under the race detector on two
			// cores (Kafka's TestContinueAfterErrors alone 76 s), which
			// the whole suite's ten minutes cannot spare. (On sql they
			// would also exhaust the shared server's max_connections: each
			// subscriber holds connections.)
			features.ForceShort = true
			// A new subscriber is a new consumer group, except on RabbitMQ,
			// where a group's queue keeps messages only once declared: its
			// subscribers share one group, as a service's instances do.
			group := func() string {
				if sb.kind == brokers.AMQP {
					return "suite"
				}
				return "g" + strings.ToLower(watermill.NewShortUUID()[:10])
			}
			tests.TestPubSub(t, features,
				func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, group()) },
				newPubSub)
		})
	}
}

// A stopped NATS subscriber leaves its group's durable consumer in place: a
// restarted instance resumes after what was acked instead of replaying the
// stream (nats.go deletes a consumer it created when its subscription ends).
func TestNATSGroupPositionSurvivesAStop(t *testing.T) {
	t.Parallel()
	prefix := testservers.NATSPrefix(t)
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.NATS,
		NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}})
	require.NoError(t, err)
	defer b.Close()
	pub := suitePublisher{b, prefix, nil}
	subject := b.Topics("orders")[0]
	read := func(n int) []string {
		sub, err := b.Subscriber("g", "c", brokers.SubscriberOptions{})
		require.NoError(t, err)
		defer sub.Close()
		msgs, err := sub.Subscribe(context.Background(), subject)
		require.NoError(t, err)
		var ids []string
		for range n {
			select {
			case m := <-msgs:
				ids = append(ids, m.UUID)
				m.Ack()
			case <-time.After(10 * time.Second):
				t.Fatalf("got %d of %d", len(ids), n)
			}
		}
		select {
		case m := <-msgs:
			t.Fatalf("redelivered %s after it was acked", m.UUID)
		case <-time.After(300 * time.Millisecond):
		}
		return ids
	}
	first := message.NewMessage(watermill.NewUUID(), []byte("1"))
	require.NoError(t, pub.Publish(subject, first))
	require.Equal(t, []string{first.UUID}, read(1))
	second := message.NewMessage(watermill.NewUUID(), []byte("2"))
	require.NoError(t, pub.Publish(subject, second))
	require.Equal(t, []string{second.UUID}, read(1), "the restarted subscriber resumes after the acked one")
}

// deleteAMQP deletes the suite's exchanges and the group's queues.
func deleteAMQP(exchanges map[string]bool, group string) {
	conn, err := amqp091.Dial(testservers.AMQPURL())
	if err != nil {
		return
	}
	defer conn.Close()
	for ex := range exchanges {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(brokers.AMQPQueueName(ex, group), false, false, false)
		_ = ch.ExchangeDelete(ex, false, false)
		_ = ch.Close()
	}
}
