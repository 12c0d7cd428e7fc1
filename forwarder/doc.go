// Package forwarder moves committed outbox rows to a broker (Redis Streams
// by default, see package brokers/redis): at least once, never lost, never
// skipped, in order per aggregate, with poison rows parked instead of
// blocking the rest.
//
// # Usage
//
// Open a broker backend, give the forwarder the outbox's pool and the
// backend's Broker, and run it until the process is told to stop:
//
//	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis,
//		Redis: brokers.RedisConfig{URL: "redis://127.0.0.1:6379/0"}})
//	if err != nil {
//		return err
//	}
//	defer backend.Close()
//	fwd, err := forwarder.New(forwarder.Config{Pool: pool, Broker: backend.Broker(), Logger: logger})
//	if err != nil {
//		return err
//	}
//	return fwd.Run(ctx) // returns when ctx ends, after the batch in flight
//
// Any number of instances may run on the same database: they share the
// outbox's partitions (Config.Partitions, a hash of the aggregate id) by
// lease, and an instance that stops is replaced within Config.TakeoverAfter.
// A writer in the same process can call [Forwarder.Wake] after its commit,
// so that its event leaves at once instead of at the next poll. Or run the
// forwarder as a process of its own: `outflow forward`.
//
// What it guarantees, and what it needs:
//
//   - Never lost: a row is published before the forwarder records it as
//     done; a crash publishes it again (a duplicate with the same message
//     id, which the consumers' idempotency drops).
//   - Never skipped: a row whose transaction commits after a later id was
//     published is still published; a long transaction holds back only its
//     own rows.
//   - In order per aggregate: an aggregate's next event goes to the broker
//     only after the previous one was acknowledged, across instances.
//   - Poison parked: a row the broker refuses is retried with backoff
//     (Config.MaxAttempts, Config.RetryBackoff), then parked with its
//     aggregate's later rows held behind it; [ListParked], [RetryParked]
//     and [DiscardParked] (or `outflow outbox`) act on them. A broker outage
//     counts no attempt.
//   - History: published rows are kept Config.Retention (15 days) for replay
//     and the console, then dropped a partition at a time, never deleted row
//     by row.
//   - Broker loss repaired: when the Broker is an [Auditor] (Redis, NATS,
//     Kafka), what the broker lost after acknowledging it is published again
//     (Config.AuditInterval).
//   - Observable: [ReadStats] and Config.Registerer's metrics, of which the
//     age of the oldest pending row is the one alert.
//
// The design (the claim, the per-partition cursor, waves, failures,
// wake-ups, PgBouncer, broker-loss repair) and the reasons for it are in
// docs/forwarder.md.
package forwarder
