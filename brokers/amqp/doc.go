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
//
// Lag (brokers.LagReporter) is the sum of the ready messages of the
// group's queues on the topic's exchanges, by a passive queue declare,
// which creates nothing (a queue not declared yet lags by nothing: its
// exchange keeps nothing for the group). AMQP 0-9-1 does not tell the
// messages delivered to a consumer and not acked yet (up to its prefetch,
// SubscriberOptions.InFlight, per instance): they are not counted. Nor
// does it tell the oldest message's age without taking the message off the
// queue or out of order, so OldestAge is always 0. Ping opens and closes a
// channel, reconnecting first as Publish does.
package amqp
