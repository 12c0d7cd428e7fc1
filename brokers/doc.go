// Package brokers builds, from one configuration block per backend, the
// only two things that change with the broker: the forwarder's publishing
// side ([forwarder.Broker]) and the workers' subscriber (a Watermill
// [message.Subscriber] per consumer group). Handlers, the idempotency
// middleware, the app and the outbox table stay as they are.
//
// Every backend keeps at-least-once delivery (the forwarder marks a row only
// after the broker acknowledged it; a consumer acks only after its
// transaction committed) and leaves deduplication and per-aggregate order to
// the idempotency middleware, which works whatever the broker's ordering.
// What each backend adds or lacks is in docs/brokers.md.
//
// A broker that drops mid-run is survived: the forwarder side returns
// [forwarder.ErrBrokerUnavailable] (the forwarder waits and retries without
// burning a row's attempts) and every subscriber reconnects by itself. A
// backend whose broker never deletes what was read (sql) is a [Trimmer].
//
// A backend that is configured but unreachable fails at Open with an error
// naming it and the URL tried (password redacted), within a few seconds.
package brokers
