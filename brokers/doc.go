// Package brokers builds, from one configuration block per backend, the
// only two things that change with the broker: the forwarder's publishing
// side ([forwarder.Broker]) and the workers' subscriber (a Watermill
// [message.Subscriber] per consumer group). Handlers, the idempotency
// middleware, the app and the outbox table stay as they are.
//
// This package links no broker client. Each backend is a package of its
// own that registers itself with [Register] when imported, as database/sql
// drivers do: brokers/redis (the default), brokers/nats, brokers/amqp,
// brokers/kafka and brokers/sql; brokers/all imports them all. [Open] of a
// backend whose package is not imported fails with [ErrNotLinked], naming
// the import to add:
//
//	import (
//		"github.com/outflow-dev/outflow/brokers"
//		_ "github.com/outflow-dev/outflow/brokers/redis"
//	)
//
//	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis})
//
// Every backend keeps at-least-once delivery (the forwarder marks a row only
// after the broker acknowledged it; a consumer acks only after its
// transaction committed) and leaves deduplication and per-aggregate order to
// the idempotency middleware, which works whatever the broker's ordering.
// What each backend adds or lacks is in docs/brokers.md; brokers/brokertest
// is the broker contract's conformance suite, which each of them passes.
//
// A broker that drops mid-run is survived: the forwarder side returns
// [forwarder.ErrBrokerUnavailable] (the forwarder waits and retries without
// burning a row's attempts) and every subscriber reconnects by itself. A
// backend whose broker never deletes what was read (sql) is a [Trimmer];
// one whose topics are trimmed by topic (redis) a [TopicTrimmer].
//
// A backend that is configured but unreachable fails at Open with an error
// naming it and the URL tried (password redacted), within a few seconds.
package brokers
