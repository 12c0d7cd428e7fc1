package amqp

import (
	"strconv"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
)

// RabbitMQ's default max_message_size, which it does not tell its
// clients: 128 MiB from 3.8 to 3.13, 16 MiB from 4.0 (and 512 MiB, the
// hard maximum, before 3.8, which had no setting).
const (
	DefaultMaxMessageBytes3 = 128 << 20
	DefaultMaxMessageBytes4 = 16 << 20
	hardMaxMessageBytes     = 512 << 20
)

var _ forwarder.PayloadLimiter = amqpBroker{}

// defaultMaxMessageBytes is the default max_message_size of the RabbitMQ
// version the connection met (the "version" of its server properties).
// A server that does not say is taken for the smallest default.
func defaultMaxMessageBytes(conn *amqp091.Connection) int {
	if conn == nil {
		return DefaultMaxMessageBytes4
	}
	major, minor, ok := serverVersion(conn.Properties)
	switch {
	case !ok || major >= 4:
		return DefaultMaxMessageBytes4
	case major == 3 && minor >= 8:
		return DefaultMaxMessageBytes3
	}
	return hardMaxMessageBytes
}

// serverVersion reads RabbitMQ's major and minor version from its
// connection.start server properties ("3.13.7", "4.0.2").
func serverVersion(props amqp091.Table) (major, minor int, ok bool) {
	v, _ := props["version"].(string)
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}

// MaxMessageBytes is brokers.AMQPConfig.MaxMessageBytes when set (the
// server's max_message_size, which an AMQP client cannot read), else the
// default of the server's version: 16 MiB for RabbitMQ 4, 128 MiB for
// 3.8 to 3.13.
func (ab amqpBroker) MaxMessageBytes() int {
	if n := ab.b.cfg.AMQP.MaxMessageBytes; n > 0 {
		return n
	}
	return int(ab.b.defaultMax.Load())
}

// MessageBytes is m's body: what RabbitMQ checks against max_message_size
// (headers and properties are not counted).
func (ab amqpBroker) MessageBytes(m forwarder.Outgoing) int { return len(m.Message.Payload) }

// contentType moves the CloudEvents datacontenttype from the headers to the
// message's content_type property, where the AMQP binding puts it.
func (b *amqpBackend) contentType(pub *amqp091.Publishing) {
	if b.cfg.CloudEvents.Disabled {
		return
	}
	if ct, ok := pub.Headers[cloudevents.AMQP.ContentTypeKey].(string); ok {
		pub.ContentType = ct
		delete(pub.Headers, cloudevents.AMQP.ContentTypeKey)
	}
}
