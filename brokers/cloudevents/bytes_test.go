package cloudevents_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// TestWireBytes measures what the attributes add to one broker message,
// as each broker counts it, for a typical event (UUIDv7 id, a UUID
// aggregate id and correlation id, a traceparent, the default source, no
// dataschema). docs/benchmarks.md records its output:
//
//	go test -run TestWireBytes -v ./brokers/cloudevents/
func TestWireBytes(t *testing.T) {
	t.Parallel()
	id, err := uuid.NewV7()
	require.NoError(t, err)
	agg := uuid.NewString()
	msg, err := forwarder.Message(forwarder.Row{MessageID: id.String(), AggregateType: "payment", AggregateID: agg, AggregateVersion: 2,
		EventType: "payment.paid", Payload: `{"payment_id": "` + agg + `", "amount": 1250, "currency": "EUR"}`,
		OccurredAt: time.Date(2026, 12, 5, 3, 4, 5, 123456000, time.UTC),
		Metadata:   `{"schema_version":"1","correlation_id":"` + uuid.NewString() + `","traceparent":"` + traceparent + `"}`})
	require.NoError(t, err)
	out := forwarder.Outgoing{Topic: "payment", AggregateID: agg, Message: msg}
	cfg := cloudevents.Config{}
	t.Logf("metadata keys and values added (outbox.Config.MaxEventBytes's count): %d bytes", cfg.AddedBytes(cloudevents.Kafka, msg))

	// Kafka and NATS: the record, the message, as the backend counts it
	// against the broker's limit.
	for _, kind := range []brokers.Kind{brokers.Kafka, brokers.NATS} {
		bc := brokers.Config{Kind: kind, Kafka: brokers.KafkaConfig{Brokers: testservers.Kafka(t)}, NATS: brokers.NATSConfig{URL: testservers.NATSURL()}}
		on := open(t, bc).Broker().(forwarder.PayloadLimiter).MessageBytes(out)
		bc.CloudEvents.Disabled = true
		off := open(t, bc).Broker().(forwarder.PayloadLimiter).MessageBytes(out)
		require.Greater(t, on, off)
		t.Logf("%s: %d bytes without, %d with: +%d (+%.0f%%)", kind, off, on, on-off, 100*float64(on-off)/float64(off))
	}

	// Redis: the entry's field names and values.
	entry := func(m *message.Message) int {
		values, err := redisstreams.CloudEventsMarshaller{}.Marshal("payment", m)
		require.NoError(t, err)
		n := 0
		for k, v := range values {
			n += len(k)
			switch v := v.(type) {
			case string:
				n += len(v)
			case []byte:
				n += len(v)
			}
		}
		return n
	}
	onR, offR := entry(cfg.Apply(cloudevents.Redis, msg)), entry(msg)
	t.Logf("redis: entry of %d bytes (field names and values) without, %d with: +%d (+%.0f%%)", offR, onR, onR-offR, 100*float64(onR-offR)/float64(offR))

	// RabbitMQ: AMQP 0-9-1 field-table entries (name length, name, 'S',
	// value length, value) and the content_type short string.
	amqpBytes := func(m map[string]string) int {
		n := 0
		for k, v := range m {
			n += 1 + len(k) + 1 + 4 + len(v)
		}
		return n
	}
	applied := cfg.Apply(cloudevents.AMQP, msg)
	onA := amqpBytes(applied.Metadata) - (1 + len(cloudevents.AMQP.ContentTypeKey) + 1 + 4 + len(cloudevents.DataContentType)) + 1 + len(cloudevents.DataContentType)
	offA := amqpBytes(msg.Metadata)
	require.Greater(t, onA, offA)
	t.Logf("amqp: headers of %d bytes without, %d with (content_type property included): +%d; body %d bytes", offA, onA, onA-offA, len(msg.Payload))
}
