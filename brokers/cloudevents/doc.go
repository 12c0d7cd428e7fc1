// Package cloudevents maps an Outflow event's envelope to CloudEvents 1.0
// attributes and writes them, at publish, in each broker's binding (binary
// content mode: the message's payload stays the event's JSON data), so a
// consumer in another language, or a CloudEvents tool, reads an Outflow
// event without Outflow.
//
// The attributes are derived from the message's envelope metadata (see
// [Attributes]) when the broker publishes: nothing more is stored in the
// outbox. [Binding] says where a broker carries them: Kafka's ce_ headers,
// NATS's ce- headers, the AMQP binding's cloudEvents_ application headers,
// and a binding of Outflow's own for Redis Streams (ce_ fields of the
// entry). brokers.WithCloudEvents applies them to a forwarder.Broker; every
// built-in backend opened with brokers.Open publishes through it unless
// brokers.Config.CloudEvents.Disabled says otherwise. docs/events.md
// ("CloudEvents on the wire") has the mapping table per broker.
package cloudevents
