// Package amqp is the RabbitMQ (AMQP 0-9-1) backend. Importing it
// registers the backend with package brokers, for [brokers.Open] with
// [brokers.AMQP]; it links amqp091-go and watermill-amqp only.
//
// RabbitMQ drops a message that reaches an exchange with no queue bound:
// the forwarder side declares, before its first publish to a topic, the
// queues of the groups [brokers.AMQPConfig.Groups] lists for it (none by
// default), and reports a message no queue took as [ErrUnroutable]. A
// consumer.Worker's Groups method lists its handlers' groups, for that
// field. What the backend keeps and lacks is in docs/brokers.md.
package amqp
