package brokers_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// These tests run the real forwarder against a backend whose engine
// refuses one message on its own (Kafka: a topic's max.message.bytes;
// NATS: a stream's MaxMsgSize) or whose limit the forwarder must respect
// before sending. The other engines cannot refuse one message of a
// well-formed row and take the next: Redis refuses an XADD only for its
// encoding or its own state (an outage); RabbitMQ refuses a single message
// only when its queue is full with overflow reject-publish, which refuses
// the aggregate's next message as well (and over its max message size it
// closes the whole channel); the sql backend's PostgreSQL refuses a row only
// for content the outbox's own columns (uuid, jsonb) already rejected. The
// forwarder's own test covers a refusal on Redis with a fault-injecting
// wrapper around the real broker.

type fwdPayload struct {
	N   int    `json:"n"`
	Pad string `json:"pad,omitempty"`
}

func (fwdPayload) EventType() string { return "fwd.tested" }

type fwdEnv struct {
	t      *testing.T
	schema *outflowtest.Schema
	writer *outbox.Writer
}

func newFwdEnv(t *testing.T, topic string) *fwdEnv {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	require.NoError(t, err)
	return &fwdEnv{t: t, schema: outflowtest.NewSchema(t), writer: w}
}

func (e *fwdEnv) write(aggregate string, version int64, pad int) string {
	e.t.Helper()
	ctx := context.Background()
	ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: aggregate, Version: version},
		fwdPayload{N: int(version), Pad: strings.Repeat("p", pad)})
	require.NoError(e.t, err)
	require.NoError(e.t, pgx.BeginFunc(ctx, e.schema.Pool, func(tx pgx.Tx) error { return e.writer.PublishTx(ctx, tx, ev) }))
	return ev.MessageID
}

func (e *fwdEnv) run(b forwarder.Broker, mut ...func(*forwarder.Config)) {
	e.t.Helper()
	cfg := forwarder.Config{
		Pool: e.schema.Pool, Broker: b, Logger: slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		PollInterval: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		OutageBackoffMax: 100 * time.Millisecond, MaxAttempts: 1000,
	}
	for _, m := range mut {
		m(&cfg)
	}
	f, err := forwarder.New(cfg)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	e.t.Cleanup(func() {
		once.Do(func() {
			cancel()
			require.NoError(e.t, <-done)
		})
	})
}

func (e *fwdEnv) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where, args...).Scan(&n))
	return n
}

// runRefusal writes x v1 (5,000 bytes of padding, over the engine's limit
// the caller set), x v2 and v3, and two rows of five other aggregates, runs
// a forwarder on b, and waits until the engine has refused x v1 three
// times and the other aggregates went through; no x row may be marked
// published meanwhile. It returns x v1's message id.
func (e *fwdEnv) runRefusal(b forwarder.Broker, engine string) string {
	e.t.Helper()
	x1 := e.write("x", 1, 5000)
	e.write("x", 2, 0)
	e.write("x", 3, 0)
	for a := range 5 {
		for v := range 2 {
			e.write(fmt.Sprint("other-", a), int64(v+1), 0)
		}
	}
	e.run(b)
	outflowtest.WaitFor(e.t, 30*time.Second, "x v1 refused by "+engine+" and retried", func() bool {
		return e.count("message_id = $1 AND attempts >= 3", x1) == 1
	})
	outflowtest.WaitFor(e.t, 30*time.Second, "the other aggregates forwarded", func() bool {
		return e.count("aggregate_id <> 'x' AND published_at IS NOT NULL") == 10
	})
	require.Equal(e.t, 3, e.count("aggregate_id = 'x' AND published_at IS NULL"), "no x row marked published")
	return x1
}

type fwdEntry struct {
	aggregate string
	version   int64
	messageID string
}

// requireFwdOrder checks that each aggregate's first deliveries come in
// version order and that want distinct messages arrived.
func requireFwdOrder(t *testing.T, entries []fwdEntry, want int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, en := range entries {
		if seen[en.messageID] {
			continue
		}
		seen[en.messageID] = true
		require.Equal(t, last[en.aggregate]+1, en.version, "aggregate %s: version %d after %d", en.aggregate, en.version, last[en.aggregate])
		last[en.aggregate] = en.version
	}
	require.Len(t, seen, want)
}

// kafkaEntries reads a topic, partition by partition in offset order (an
// aggregate lives on one partition).
func kafkaEntries(t *testing.T, addrs []string, topic string) []fwdEntry {
	t.Helper()
	c, err := sarama.NewClient(addrs, sarama.NewConfig())
	require.NoError(t, err)
	defer c.Close()
	consumer, err := sarama.NewConsumerFromClient(c)
	require.NoError(t, err)
	defer consumer.Close()
	parts, err := c.Partitions(topic)
	require.NoError(t, err)
	var out []fwdEntry
	for _, p := range parts {
		newest, err := c.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
		if newest == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		for {
			var cm *sarama.ConsumerMessage
			select {
			case cm = <-pc.Messages():
			case <-time.After(10 * time.Second):
				t.Fatalf("partition %d: no record at offset < %d", p, newest)
			}
			msg, err := kafka.DefaultMarshaler{}.Unmarshal(cm)
			require.NoError(t, err)
			env, err := events.EnvelopeFromMessage(msg)
			require.NoError(t, err)
			out = append(out, fwdEntry{env.AggregateID, env.AggregateVersion, env.MessageID})
			if cm.Offset == newest-1 {
				break
			}
		}
		require.NoError(t, pc.Close())
	}
	return out
}

func aggregateEntries(entries []fwdEntry, aggregate string) []fwdEntry {
	var out []fwdEntry
	for _, en := range entries {
		if en.aggregate == aggregate {
			out = append(out, en)
		}
	}
	return out
}

// Kafka refuses x v1 (over the topic's max.message.bytes, below the
// forwarder's limit) and would take x v2: v2 waits, unmarked and unsent,
// while the other aggregates flow; once the topic takes v1, both arrive in
// order.
func TestForwarderOnKafkaHoldsAnAggregateBehindARefusedRecord(t *testing.T) {
	t.Parallel()
	addrs := outflowtest.Kafka(t)
	b := openTestKafka(t, addrs) // topic prefix "t."
	const topic, kafkaTopic = "orders", "t.orders"
	admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	small := "3000"
	require.NoError(t, admin.CreateTopic(kafkaTopic, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"max.message.bytes": &small}}, false))

	e := newFwdEnv(t, topic)
	x1 := e.runRefusal(b.Broker(), "Kafka")
	var lastErr string
	require.NoError(t, e.schema.Pool.QueryRow(context.Background(), `SELECT last_error FROM outbox WHERE message_id = $1`, x1).Scan(&lastErr))
	require.Contains(t, lastErr, "too large")
	require.Empty(t, aggregateEntries(kafkaEntries(t, addrs, kafkaTopic), "x"), "no x record on the topic while v1 is refused")

	big := "1048588"
	require.NoError(t, admin.AlterConfig(sarama.TopicResource, kafkaTopic, map[string]*string{"max.message.bytes": &big}, false))
	outflowtest.WaitFor(t, 30*time.Second, "x forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireFwdOrder(t, kafkaEntries(t, addrs, kafkaTopic), 13)
}

// A row whose payload fits MaxPayloadBytes (1 MiB) but whose record, with
// its headers and key, does not fit the producer's MaxMessageBytes is never
// sent: the forwarder parks it at its first attempt with an error naming
// both limits.
func TestForwarderOnKafkaParksWhatCannotFitBeforeSending(t *testing.T) {
	t.Parallel()
	addrs := outflowtest.Kafka(t)
	b := openTestKafka(t, addrs)
	lim, ok := b.Broker().(forwarder.PayloadLimiter)
	require.True(t, ok, "the Kafka broker reports its limit")
	require.Equal(t, 1<<20, lim.MaxMessageBytes(), "sarama's Producer.MaxMessageBytes")

	e := newFwdEnv(t, "big")
	x1 := e.write("x", 1, 1<<20-200) // the payload fits 1 MiB, the record does not
	e.write("x", 2, 0)
	e.write("y", 1, 0)
	e.run(b.Broker(), func(c *forwarder.Config) { c.MaxAttempts = 3 })

	outflowtest.WaitFor(t, 20*time.Second, "x v1 parked", func() bool { return e.count("parked_at IS NOT NULL") == 1 })
	parked, err := forwarder.ListParked(context.Background(), e.schema.Pool, 10)
	require.NoError(t, err)
	require.Equal(t, x1, parked[0].MessageID)
	require.Equal(t, 1, parked[0].Attempts, "too large: parked at once")
	require.Contains(t, parked[0].LastError, "over the broker's limit of 1048576 bytes, which applied (MaxPayloadBytes is 1048576)")
	outflowtest.WaitFor(t, 20*time.Second, "y forwarded", func() bool { return e.count("aggregate_id = 'y' AND published_at IS NOT NULL") == 1 })
	require.Equal(t, 1, e.count("aggregate_id = 'x' AND aggregate_version = 2 AND published_at IS NULL"), "x v2 waits behind its parked v1")
}

func natsEntries(t *testing.T, js nats.JetStreamContext, stream string) []fwdEntry {
	t.Helper()
	info, err := js.StreamInfo(stream)
	require.NoError(t, err)
	var out []fwdEntry
	var um wmnats.NATSMarshaler
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := js.GetMsg(stream, seq)
		require.NoError(t, err)
		msg, err := um.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		require.NoError(t, err)
		env, err := events.EnvelopeFromMessage(msg)
		require.NoError(t, err)
		out = append(out, fwdEntry{env.AggregateID, env.AggregateVersion, env.MessageID})
	}
	return out
}

func openFwdNATS(t *testing.T, prefix string) (brokers.Backend, nats.JetStreamContext) {
	t.Helper()
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.NATS, Logger: kafkaTestLogger,
		NATS: brokers.NATSConfig{URL: outflowtest.NATSURL(), StreamPrefix: prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	conn, err := nats.Connect(outflowtest.NATSURL())
	require.NoError(t, err)
	t.Cleanup(conn.Close)
	js, err := conn.JetStream()
	require.NoError(t, err)
	return b, js
}

// JetStream refuses x v1 (over its stream's MaxMsgSize, below max_payload
// and the forwarder's limit) and would take x v2: v2 waits while the other
// aggregates flow; once the stream takes v1, both arrive in order.
func TestForwarderOnNATSHoldsAnAggregateBehindARefusedMessage(t *testing.T) {
	t.Parallel()
	prefix := outflowtest.NATSPrefix(t)
	b, js := openFwdNATS(t, prefix)
	const topic = "orders"
	stream := prefix + topic // no dots: the stream is named as its subject
	_, err := js.AddStream(&nats.StreamConfig{Name: stream, Subjects: []string{prefix + topic, prefix + topic + ".*"},
		Storage: nats.FileStorage, Replicas: 1, Retention: nats.LimitsPolicy, MaxMsgSize: 3000})
	require.NoError(t, err)

	e := newFwdEnv(t, topic)
	e.runRefusal(b.Broker(), "JetStream")
	require.Empty(t, aggregateEntries(natsEntries(t, js, stream), "x"), "no x message in the stream while v1 is refused")

	info, err := js.StreamInfo(stream)
	require.NoError(t, err)
	cfg := info.Config
	cfg.MaxMsgSize = -1
	_, err = js.UpdateStream(&cfg)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 30*time.Second, "x forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireFwdOrder(t, natsEntries(t, js, stream), 13)
}

// A row whose payload fits MaxPayloadBytes but whose message, with its
// headers, does not fit the server's max_payload is never sent: the
// forwarder parks it at its first attempt with an error naming both
// limits.
func TestForwarderOnNATSParksWhatCannotFitBeforeSending(t *testing.T) {
	t.Parallel()
	prefix := outflowtest.NATSPrefix(t)
	b, _ := openFwdNATS(t, prefix)
	lim, ok := b.Broker().(forwarder.PayloadLimiter)
	require.True(t, ok, "the NATS broker reports its limit")
	max := lim.MaxMessageBytes()
	require.Positive(t, max)

	e := newFwdEnv(t, "big")
	x1 := e.write("x", 1, max-200) // the payload fits, the message with its headers does not
	e.write("x", 2, 0)
	e.write("y", 1, 0)
	e.run(b.Broker(), func(c *forwarder.Config) { c.MaxPayloadBytes = max; c.MaxAttempts = 3 })

	outflowtest.WaitFor(t, 20*time.Second, "x v1 parked", func() bool { return e.count("parked_at IS NOT NULL") == 1 })
	parked, err := forwarder.ListParked(context.Background(), e.schema.Pool, 10)
	require.NoError(t, err)
	require.Equal(t, x1, parked[0].MessageID)
	require.Equal(t, 1, parked[0].Attempts, "too large: parked at once")
	require.Contains(t, parked[0].LastError, fmt.Sprintf("over the broker's limit of %d bytes, which applied (MaxPayloadBytes is %d)", max, max))
	outflowtest.WaitFor(t, 20*time.Second, "y forwarded", func() bool { return e.count("aggregate_id = 'y' AND published_at IS NOT NULL") == 1 })
	require.Equal(t, 1, e.count("aggregate_id = 'x' AND aggregate_version = 2 AND published_at IS NULL"), "x v2 waits behind its parked v1")
}

// A Tee's limit is its tighter side's: a message is over it exactly when it
// is over one side's own limit, each side counting its own way.
func TestTeeLimitIsTheTighterSide(t *testing.T) {
	t.Parallel()
	k := openTestKafka(t, outflowtest.Kafka(t))
	n, _ := openFwdNATS(t, outflowtest.NATSPrefix(t))
	kl := k.Broker().(forwarder.PayloadLimiter)
	nl := n.Broker().(forwarder.PayloadLimiter)
	tl, ok := brokers.Tee(k.Broker(), n.Broker()).(forwarder.PayloadLimiter)
	require.True(t, ok)
	require.Equal(t, min(kl.MaxMessageBytes(), nl.MaxMessageBytes()), tl.MaxMessageBytes())

	over := func(l forwarder.PayloadLimiter, m forwarder.Outgoing) bool {
		return l.MessageBytes(m) > l.MaxMessageBytes()
	}
	sawOnlyOne := false
	for size := tl.MaxMessageBytes() - 600; size <= tl.MaxMessageBytes(); size += 7 {
		m := kafkaOutgoing("orders", "agg-1", 0)
		m.Message.Payload = []byte(strings.Repeat("x", size))
		require.Equal(t, over(kl, m) || over(nl, m), over(tl, m), "payload of %d bytes", size)
		sawOnlyOne = sawOnlyOne || over(kl, m) != over(nl, m)
	}
	require.True(t, sawOnlyOne, "the range holds messages over one side's limit only")

	// A side without a limit (Redis) leaves the other's.
	rb, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.Redis, Logger: kafkaTestLogger})
	require.NoError(t, err)
	t.Cleanup(func() { rb.Close() })
	_, redisLimits := rb.Broker().(forwarder.PayloadLimiter)
	require.False(t, redisLimits)
	require.Equal(t, kl.MaxMessageBytes(), brokers.Tee(rb.Broker(), k.Broker()).(forwarder.PayloadLimiter).MaxMessageBytes())
}

// Through a Tee, a row over one side's limit reaches neither: without the
// check before sending, the side that takes it (Redis) would get a copy at
// every attempt.
func TestForwarderOnTeeSendsWhatCannotFitNowhere(t *testing.T) {
	t.Parallel()
	rc := outflowtest.Redis(t)
	prefix := outflowtest.UniqueName(t, rc)
	rb, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.Redis, Logger: kafkaTestLogger,
		Redis: brokers.RedisConfig{StreamPrefix: prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { rb.Close() })
	k := openTestKafka(t, outflowtest.Kafka(t))

	e := newFwdEnv(t, "big")
	e.write("x", 1, 1<<20-200) // over Kafka's record limit with its headers
	e.write("y", 1, 0)
	e.run(brokers.Tee(rb.Broker(), k.Broker()), func(c *forwarder.Config) { c.MaxAttempts = 3 })

	outflowtest.WaitFor(t, 20*time.Second, "x parked, y forwarded", func() bool {
		return e.count("parked_at IS NOT NULL") == 1 && e.count("published_at IS NOT NULL") == 1
	})
	entries, err := rc.XRange(context.Background(), prefix+"big", "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1, "only y reached Redis: x was never handed to either side")
}

// shortBroker is a real broker that loses its results: it publishes, then
// answers for none of the messages.
type shortBroker struct{ forwarder.Broker }

func (s shortBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	_ = s.Broker.Publish(ctx, msgs)
	return nil
}

// A Tee side that answers for fewer messages than it was given did not
// acknowledge the rest: the Tee must not report them published.
func TestTeeCountsAMissingResultAsUnavailable(t *testing.T) {
	t.Parallel()
	rc := outflowtest.Redis(t)
	prefix := outflowtest.UniqueName(t, rc)
	rb, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.Redis, Logger: kafkaTestLogger,
		Redis: brokers.RedisConfig{StreamPrefix: prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { rb.Close() })
	msgs := []forwarder.Outgoing{kafkaOutgoing("tee", "a", 1), kafkaOutgoing("tee", "b", 1)}
	for _, tee := range []forwarder.Broker{brokers.Tee(rb.Broker(), shortBroker{rb.Broker()}), brokers.Tee(shortBroker{rb.Broker()}, rb.Broker())} {
		errs := tee.Publish(context.Background(), msgs)
		require.Len(t, errs, len(msgs))
		for _, err := range errs {
			require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
		}
	}
}
