package amqp_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	amqpbackend "github.com/outflow-dev/outflow/brokers/amqp"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

type blob struct {
	Data string `json:"data"`
}

func (blob) EventType() string { return "blob.stored" }

// RabbitMQ does not tell a client its max_message_size: the ceiling is the
// default of the version the server reports (the shared test server is
// not reconfigured), or AMQPConfig.MaxMessageBytes, against the body,
// which is what RabbitMQ measures.
func TestCeilingIsTheServerVersionsDefault(t *testing.T) {
	t.Parallel()
	conn, err := amqp091.Dial(testservers.AMQPURL())
	require.NoError(t, err, "RabbitMQ at %s (make services-up)", testservers.AMQPURL())
	t.Cleanup(func() { _ = conn.Close() })
	version, _ := conn.Properties["version"].(string)
	want := amqpbackend.DefaultMaxMessageBytes4
	if strings.HasPrefix(version, "3.") {
		want = amqpbackend.DefaultMaxMessageBytes3 // the test server is 3.8 or later
	}

	b := openAMQPTest(t, testservers.AMQPURL(), nil)
	lim, ok := b.Broker().(forwarder.PayloadLimiter)
	require.True(t, ok)
	require.Equal(t, want, lim.MaxMessageBytes(), "RabbitMQ %s's default max_message_size", version)
	m := amqpOutgoing("orders", "a")[0]
	require.Equal(t, len(m.Message.Payload), lim.MessageBytes(m), "the body, without the headers")
}

// A configured max_message_size is the ceiling: the outbox writer refuses
// a larger event inside the business transaction.
func TestConfiguredCeilingRefusesAtWriteTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, err := brokers.Open(ctx, brokers.Config{Kind: brokers.AMQP, AMQP: brokers.AMQPConfig{URL: testservers.AMQPURL(), MaxMessageBytes: 4096}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.Equal(t, 4096, b.Broker().(forwarder.PayloadLimiter).MaxMessageBytes())

	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Broker: b.Broker(), MaxEventBytes: -1})
	require.NoError(t, err)
	write := func(n int) error {
		return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			return w.WriteTx(ctx, tx, events.Aggregate{Type: "blob", ID: uuid.NewString(), Version: 1}, blob{Data: strings.Repeat("x", n)})
		})
	}
	body := len(`{"data": ""}`)
	require.NoError(t, write(4096-body), "a body of exactly the limit")
	err = write(4096 - body + 1)
	var tl *outbox.EventTooLargeError
	require.True(t, errors.As(err, &tl), "%v", err)
	require.True(t, tl.Broker)
	require.Equal(t, 4096, tl.Limit)
	require.Equal(t, 4097, tl.Size)
}
