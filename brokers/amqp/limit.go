package amqp

import (
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
// version the connection met (its connection.start major and minor).
func defaultMaxMessageBytes(conn *amqp091.Connection) int {
	switch {
	case conn == nil:
		return DefaultMaxMessageBytes4 // the smallest: errs on the safe side
	case conn.Major >= 4:
		return DefaultMaxMessageBytes4
	case conn.Major == 3 && conn.Minor >= 8:
		return DefaultMaxMessageBytes3
	}
	return hardMaxMessageBytes
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
