package cloudevents_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/amqp"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	_ "github.com/outflow-dev/outflow/brokers/kafka"
	_ "github.com/outflow-dev/outflow/brokers/nats"
	_ "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

// paid is version 2 of its shape, so the schema version and the
// dataschema template have something to say.
type paid struct {
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
	Note      string `json:"note"`
}

func (paid) EventType() string  { return "payment.paid" }
func (paid) SchemaVersion() int { return 2 }

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

var wireConfig = cloudevents.Config{Source: "/payments", DataSchema: "https://schemas.example.com/{type}/v{version}.json"}

// written is what PostgreSQL holds of the event the test wrote.
type written struct {
	MessageID, AggregateID, Payload string
	OccurredAt                      time.Time
}

// forwardOne writes one event into a real outbox, inside a business
// transaction, and runs the real forwarder until it is published on b.
func forwardOne(t *testing.T, b brokers.Backend) written {
	t.Helper()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Broker: b.Broker()})
	require.NoError(t, err)
	aggID := uuid.NewString()
	wctx := events.WithTraceparent(events.WithCorrelationID(ctx, "corr-42"), traceparent)
	ev, err := events.New(wctx, events.Aggregate{Type: "payment", ID: aggID, Version: 1},
		paid{PaymentID: aggID, Amount: 1250, Note: "caf\u00e9 \"quoted\""})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(wctx, tx, ev) }))

	fwd, err := forwarder.New(forwarder.Config{Pool: s.Pool, Broker: b.Broker(), PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fwd.Run(fctx) }()
	t.Cleanup(func() { stop(); <-done })
	outflowtest.WaitFor(t, 30*time.Second, "the event published", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE state = 'published'`).Scan(&n))
		return n == 1
	})
	var got written
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT message_id::text, aggregate_id, payload::text, occurred_at FROM outbox`).
		Scan(&got.MessageID, &got.AggregateID, &got.Payload, &got.OccurredAt))
	require.Equal(t, ev.MessageID, got.MessageID)
	return got
}

// requireEvent asserts every attribute the CloudEvents SDK read, and that
// the data is the payload as the outbox holds it.
func requireEvent(t *testing.T, e *event.Event, w written) {
	t.Helper()
	require.NoError(t, e.Validate())
	require.Equal(t, w.MessageID, e.ID())
	require.Equal(t, "/payments", e.Source())
	require.Equal(t, "1.0", e.SpecVersion())
	require.Equal(t, "payment.paid", e.Type())
	require.True(t, w.OccurredAt.Equal(e.Time()), "time %s, occurred_at %s", e.Time(), w.OccurredAt)
	require.Equal(t, w.AggregateID, e.Subject())
	require.Equal(t, "application/json", e.DataContentType())
	require.Equal(t, "https://schemas.example.com/payment.paid/v2.json", e.DataSchema())
	ext := e.Extensions()
	for name, want := range map[string]string{
		cloudevents.ExtAggregateType:    "payment",
		cloudevents.ExtAggregateVersion: "1",
		cloudevents.ExtSchemaVersion:    "2",
		cloudevents.ExtCorrelationID:    "corr-42",
		cloudevents.ExtTraceparent:      traceparent,
		cloudevents.ExtPartitionKey:     w.AggregateID,
	} {
		require.Contains(t, ext, name)
		require.Equal(t, want, fmt.Sprint(ext[name]), name)
	}
	require.Equal(t, w.Payload, string(e.Data()), "the data is the payload as forwarded")
	var p paid
	require.NoError(t, e.DataAs(&p))
	require.Equal(t, int64(1250), p.Amount)
}

func TestSDKReadsRedisEntry(t *testing.T) {
	t.Parallel()
	client := testservers.Redis(t)
	b := open(t, brokers.Config{Kind: brokers.Redis, CloudEvents: wireConfig,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: testservers.UniqueName(t, client)}})
	w := forwardOne(t, b)
	entries, err := client.XRange(context.Background(), b.Topics("payment")[0], "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	e, err := binding.ToEvent(context.Background(), redisEntry(entries[0].Values))
	require.NoError(t, err)
	requireEvent(t, e, w)
}

func TestSDKReadsNATSMessage(t *testing.T) {
	t.Parallel()
	b := open(t, brokers.Config{Kind: brokers.NATS, CloudEvents: wireConfig,
		NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: testservers.NATSPrefix(t)}})
	w := forwardOne(t, b)
	nc, err := nats.Connect(testservers.NATSURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	require.NoError(t, err)
	sub, err := js.SubscribeSync(b.Topics("payment")[0], nats.DeliverAll(), nats.AckNone())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	msg, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	m := nats_jetstream.NewMessage(msg)
	require.Equal(t, binding.EncodingBinary, m.ReadEncoding())
	e, err := binding.ToEvent(context.Background(), m)
	require.NoError(t, err)
	requireEvent(t, e, w)
}

func TestSDKReadsKafkaRecord(t *testing.T) {
	t.Parallel()
	seeds := testservers.Kafka(t)
	b := open(t, brokers.Config{Kind: brokers.Kafka, CloudEvents: wireConfig,
		Kafka: brokers.KafkaConfig{Brokers: seeds, TopicPartitions: 3}})
	w := forwardOne(t, b)
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	consumer, err := sarama.NewConsumer(seeds, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = consumer.Close() })
	topic := b.Topics("payment")[0]
	partitions, err := consumer.Partitions(topic)
	require.NoError(t, err)
	records := make(chan *sarama.ConsumerMessage, len(partitions))
	for _, p := range partitions {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		t.Cleanup(func() { _ = pc.Close() })
		go func() {
			for m := range pc.Messages() {
				records <- m
			}
		}()
	}
	var rec *sarama.ConsumerMessage
	select {
	case rec = <-records:
	case <-time.After(30 * time.Second):
		t.Fatal("no record on the Kafka topic within 30s")
	}
	require.Equal(t, w.AggregateID, string(rec.Key), "the record's key is the partition key")
	m := kafka_sarama.NewMessageFromConsumerMessage(rec)
	require.Equal(t, binding.EncodingBinary, m.ReadEncoding())
	e, err := binding.ToEvent(context.Background(), m)
	require.NoError(t, err)
	requireEvent(t, e, w)
}

// RabbitMQ: the SDK's AMQP binding is for AMQP 1.0 (and its module is not
// served here), so the reader is the one a 0-9-1 consumer would write by
// the AMQP binding's naming: cloudEvents_ headers, the content_type property.
func TestSDKReadsRabbitMQMessage(t *testing.T) {
	t.Parallel()
	groups := map[string][]string{"payment": {"sdk"}}
	prefix := testservers.AMQPPrefix(t, 1, groups)
	b := open(t, brokers.Config{Kind: brokers.AMQP, CloudEvents: wireConfig,
		AMQP: brokers.AMQPConfig{URL: testservers.AMQPURL(), Prefix: prefix, Groups: groups}})
	w := forwardOne(t, b)
	conn, err := amqp091.Dial(testservers.AMQPURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	d, ok, err := ch.Get(brokers.AMQPQueueName(b.Topics("payment")[0], "sdk"), true)
	require.NoError(t, err)
	require.True(t, ok, "the message is in the group's queue")
	require.Equal(t, "application/json", d.ContentType)
	e, err := binding.ToEvent(context.Background(), amqpDelivery(d))
	require.NoError(t, err)
	requireEvent(t, e, w)
}

// Disabled, a broker message is what it was: Outflow's metadata only.
func TestDisabledWritesNoAttributes(t *testing.T) {
	t.Parallel()
	client := testservers.Redis(t)
	b := open(t, brokers.Config{Kind: brokers.Redis, CloudEvents: cloudevents.Config{Disabled: true},
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: testservers.UniqueName(t, client)}})
	forwardOne(t, b)
	entries, err := client.XRange(context.Background(), b.Topics("payment")[0], "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	for k := range entries[0].Values {
		require.False(t, cloudevents.Redis.IsKey(k), "field %q with CloudEvents disabled", k)
	}
}

func open(t *testing.T, cfg brokers.Config) brokers.Backend {
	t.Helper()
	b, err := brokers.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// headerMessage is a binary-mode binding.Message over string headers with
// a prefix, and a content type and data of their own: what a consumer in
// another stack writes for a broker the SDK has no binding of.
type headerMessage struct {
	prefix      string
	headers     map[string]string
	contentType string
	data        []byte
}

// redisEntry reads a stream entry by Outflow's Redis binding: ce_ fields,
// content-type, the data in the payload field.
func redisEntry(values map[string]any) *headerMessage {
	m := &headerMessage{prefix: cloudevents.Redis.Prefix, headers: map[string]string{}}
	for k, v := range values {
		s, _ := v.(string)
		switch {
		case k == "payload":
			m.data = []byte(s)
		case k == cloudevents.Redis.ContentTypeKey:
			m.contentType = s
		default:
			m.headers[k] = s
		}
	}
	return m
}

// amqpDelivery reads a RabbitMQ message by the AMQP binding's naming.
func amqpDelivery(d amqp091.Delivery) *headerMessage {
	m := &headerMessage{prefix: cloudevents.AMQP.Prefix, headers: map[string]string{}, contentType: d.ContentType, data: d.Body}
	for k, v := range d.Headers {
		if s, ok := v.(string); ok {
			m.headers[k] = s
		}
	}
	return m
}

func (m *headerMessage) version() spec.Version {
	return spec.WithPrefix(m.prefix).Version(m.headers[m.prefix+"specversion"])
}

func (m *headerMessage) ReadEncoding() binding.Encoding {
	if m.version() == nil {
		return binding.EncodingUnknown
	}
	return binding.EncodingBinary
}

func (m *headerMessage) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

func (m *headerMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	v := m.version()
	if v == nil {
		return binding.ErrNotBinary
	}
	for k, val := range m.headers {
		if !strings.HasPrefix(k, m.prefix) {
			continue
		}
		var err error
		if attr := v.Attribute(k); attr != nil {
			err = w.SetAttribute(attr, val)
		} else {
			err = w.SetExtension(strings.TrimPrefix(k, m.prefix), val)
		}
		if err != nil {
			return err
		}
	}
	if m.contentType != "" {
		if err := w.SetAttribute(v.AttributeFromKind(spec.DataContentType), m.contentType); err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.data))
}

func (m *headerMessage) Finish(error) error { return nil }

// GetAttribute and GetExtension make it a binding.MessageMetadataReader,
// which the SDK's binary writer reads the version through.
func (m *headerMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	v := m.version()
	if v == nil {
		return nil, nil
	}
	attr := v.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		return attr, m.contentType
	}
	if val, ok := m.headers[attr.PrefixedName()]; ok {
		return attr, val
	}
	return attr, nil
}

func (m *headerMessage) GetExtension(name string) any {
	if val, ok := m.headers[m.prefix+name]; ok {
		return val
	}
	return nil
}

// A discard marker, sent by the forwarder for a row an operator discarded,
// and a replay (package replay) carry the attributes too: they publish
// through the same Broker.
func TestSDKReadsDiscardMarkerAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testservers.Redis(t)
	b := open(t, brokers.Config{Kind: brokers.Redis, CloudEvents: wireConfig,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: testservers.UniqueName(t, client)}})
	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{})
	require.NoError(t, err)
	aggID := uuid.NewString()
	ev, err := events.New(ctx, events.Aggregate{Type: "payment", ID: aggID, Version: 1}, paid{PaymentID: aggID, Note: strings.Repeat("n", 500)})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))

	// Parked as too large for the forwarder's MaxPayloadBytes, then
	// discarded: the marker goes out in its place.
	fwd, err := forwarder.New(forwarder.Config{Pool: s.Pool, Broker: b.Broker(), PollInterval: 10 * time.Millisecond, MaxPayloadBytes: 100})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fwd.Run(fctx) }()
	t.Cleanup(func() { stop(); <-done })
	outflowtest.WaitFor(t, 30*time.Second, "the event parked", func() bool {
		parked, err := forwarder.ListParked(ctx, s.Pool, 10)
		require.NoError(t, err)
		return len(parked) == 1
	})
	outflowtest.WaitFor(t, 30*time.Second, "the parked event discarded", func() bool {
		n, err := forwarder.DiscardParked(ctx, s.Pool, forwarder.ParkedFilter{Topic: "payment"})
		require.NoError(t, err)
		return n == 1
	})
	stream := b.Topics("payment")[0]
	outflowtest.WaitFor(t, 30*time.Second, "the discard marker on the stream", func() bool {
		l, err := client.XLen(ctx, stream).Result()
		require.NoError(t, err)
		return l == 1
	})
	requireMarker := func(stream string) {
		t.Helper()
		entries, err := client.XRange(ctx, stream, "-", "+").Result()
		require.NoError(t, err)
		require.Len(t, entries, 1)
		e, err := binding.ToEvent(ctx, redisEntry(entries[0].Values))
		require.NoError(t, err)
		require.NoError(t, e.Validate())
		require.Equal(t, ev.MessageID, e.ID())
		require.Equal(t, events.EventTypeDiscarded, e.Type())
		require.Equal(t, aggID, e.Subject())
		require.Equal(t, "https://schemas.example.com/outflow.discarded/v1.json", e.DataSchema())
		require.Equal(t, "{}", string(e.Data()))
		require.Equal(t, "1", fmt.Sprint(e.Extensions()[cloudevents.ExtAggregateVersion]))
	}
	requireMarker(stream)

	// A replay chooses published rows: once the forwarder recorded it.
	outflowtest.WaitFor(t, 30*time.Second, "the marker recorded published", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE state = 'published'`).Scan(&n))
		return n == 1
	})
	published, err := replay.Publish(ctx, s.Pool, b.Broker(), "audit", replay.Filter{Topic: "payment"}, replay.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(1), published)
	requireMarker(b.Topics(consumer.ReplayTopic("audit"))[0])
}
