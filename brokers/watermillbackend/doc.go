// Package watermillbackend makes a Watermill publisher and subscriber a
// [brokers.Backend]: the forwarder publishes through it and a
// consumer.Worker reads through it, for a broker Outflow has no backend
// for, or for an in-process GoChannel in tests and single-process tools.
//
// Over a persistent GoChannel, shared by every consumer group:
//
//	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
//	backend, err := watermillbackend.New(watermillbackend.Config{
//		Publish:    watermillpub.Config{Publisher: pubSub},
//		Subscriber: pubSub,
//	})
//	// forwarder.Config{Broker: backend.Broker(), ...}
//	// consumer.WorkerConfig{Broker: backend, ...}
//	// at the end: backend.Close(), then pubSub.Close()
//
// Over a broker with consumer groups of its own (watermill-sql here), with
// a subscriber per consumer:
//
//	backend, err := watermillbackend.New(watermillbackend.Config{
//		Publish: watermillpub.Config{Publisher: sqlPublisher},
//		NewSubscriber: func(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
//			return wmsql.NewSubscriber(db, wmsql.SubscriberConfig{ConsumerGroup: group, AckDeadline: &opts.ClaimIdle,
//				SchemaAdapter: schema, OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true}, logger)
//		},
//	})
//
// # Publishing
//
// Broker is package watermillpub's broker over Config.Publish: its package
// documentation says what it keeps of the forwarder's contract (one
// Publisher call per message, so per-message results; the broker's
// outages told from a message's fault by a classifier; no payload limit
// unless configured). An acknowledgement is only as good as the
// Publisher's: one that returns before the broker has the message loses
// what it held when it fails.
//
// # Consumer groups
//
// [brokers.Backend.Subscriber] is asked for a consumer group (a Worker's
// handler name) and a consumer (the Worker's instance). Every group must
// get every message of its topics; the consumers of one group share them.
// Who provides that depends on which of the two subscriber settings is set:
//
//   - Config.NewSubscriber: the factory's job. It gets the group and the
//     consumer and returns a subscriber of that group (watermill-sql's
//     ConsumerGroup, Kafka's consumer group, a NATS queue group, a
//     RabbitMQ queue per group); the groups are the broker's, across
//     processes. Each call returns a subscriber of its own, which the
//     Worker closes when it stops.
//   - Config.Subscriber: one subscriber without groups, shared (every
//     Subscribe of it receives every message: a GoChannel). The backend
//     provides the groups, within itself (so within one process): a
//     group's consumers share one subscription per topic, each message
//     going to one of them. A consumer holds SubscriberOptions.InFlight
//     messages unsettled (neither acked nor nacked) at most: the next
//     goes to another consumer of the group, or to it once it settles
//     one. A message it was handed stays its own until it settles it,
//     even once its subscription ended, as its handler may still run (a
//     Watermill router closes its subscriber before its handlers return):
//     a nack then sends it to another consumer; one it had taken but not
//     handed out when its subscription ended is nacked so at once. When
//     the last consumer of a group leaves a topic, the group's
//     subscription ends, and its next one gets what the subscriber gives
//     a new subscription (a persistent GoChannel: the whole topic again,
//     which the Worker's middleware drops as duplicates; a message still
//     being handled then may be handed out again while it is). ClaimIdle
//     does not apply: a consumer of this process that is alive is not
//     taken for dead.
//
// # Closing
//
// The backend never closes the Publisher nor the shared Subscriber: they
// are the caller's, who may share them with other code (close them after
// the Backend). Closing a subscriber over the shared Subscriber ends that
// consumer's subscriptions only; the group's other consumers, the other
// groups and the forwarder go on. Closing a NewSubscriber subscriber is
// the broker library's Close of it. Closing the Backend ends the
// subscriptions still open over the shared Subscriber (their channels
// close) and makes Subscriber fail with [ErrClosed]; publishing through
// Broker goes on as long as the Publisher does.
//
// # Setups that lose messages
//
// A setup that drops what the forwarder publishes loses events for good,
// because the outbox marks a row published once the Publisher returned.
// [New] and [Backend.Subscriber] refuse what they can tell:
//
//   - a GoChannel without gochannel.Config.Persistent (as Publisher or
//     Subscriber), which drops a message published to a topic nobody
//     subscribes to yet: a group whose Worker has not started, or one
//     between two subscriptions ([ErrLosesMessages]);
//   - a subscriber from NewSubscriber that is the Publisher, a GoChannel,
//     or one it returned before (a subscriber built outside the function,
//     returned to every group): a shared subscriber, which closing one
//     group's subscriber would close for every group, and the Publisher
//     for the forwarder ([ErrSharedSubscriber], the subscriber left open);
//     pass a shared one as Config.Subscriber;
//   - two different GoChannels as Publisher and Subscriber (a GoChannel
//     delivers only what was published to it).
//
// A GoChannel with BlockPublishUntilSubscriberAck is accepted with a
// warning: each publish waits for every subscribed group to handle the
// message, so the slowest group paces the forwarder. A persistent
// GoChannel keeps every message in memory until it is closed, and loses
// them all with the process: it is for tests, demos and single-process
// tools, not a production broker. What the backend cannot see, the broker
// library's settings must keep: a broker that drops messages for a group
// not created yet (a RabbitMQ exchange with no queue bound, NATS without
// JetStream) loses them the same way. Run brokers/brokertest on your setup.
//
// # Order
//
// The forwarder publishes an aggregate's next event only once the
// Publisher acknowledged the one before, so a broker that delivers in
// publish order delivers each aggregate in version order. A GoChannel does
// not: it hands each message to each subscription in a goroutine of its
// own. When Config.Subscriber is a GoChannel, the backend numbers each
// topic's messages as it publishes them ([SequenceKey]) and each group's
// subscription hands them out in that order. That orders the hand-off,
// not the handling: a consumer with InFlight above 1 is handed the next
// messages while it handles one (a Watermill router handles them at the
// same time), and a group's consumers share them; with one consumer of
// InFlight 1, each message is handed out once the one before it is
// settled, so the order holds end to end. A message delivered again after
// a nack comes at once, out of order, which the Worker's middleware puts
// right (a Worker's InFlight is its handler's BatchSize). A
// NewSubscriber subscriber delivers in its broker's order
// (watermill-sql: a table's rows in commit order, one at a time, each
// after the previous one's ack; package brokers/sql reads the same tables
// faster).
//
// The backend is not a [brokers.LagReporter], [brokers.Trimmer] nor
// [forwarder.Auditor], and is not registered with [brokers.Register]: its
// configuration is code (a publisher, a subscriber), not data. Kind names
// it in the Worker's metrics and spans.
//
// The broker conformance suite (brokers/brokertest) and a Worker handling
// outbox events end to end run on it over a persistent GoChannel (whose
// outage, as it cannot be cut off, is a publisher failing as a closed
// connection does) and over watermill-sql v4 on pgx (whose outage is a
// proxy in front of PostgreSQL).
package watermillbackend
