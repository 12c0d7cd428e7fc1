// Package idempotency makes a Watermill handler safe on an at-least-once,
// possibly reordered stream: a duplicate delivery changes nothing, and each
// aggregate's events are applied in version order.
//
// [Middleware] opens a transaction in the consumer's database for every
// message and, in one statement, records (message_id, consumer) in
// processed_messages and checks the message's aggregate_version against the
// last one this consumer applied for that aggregate. The handler then runs
// with that transaction in its context ([Tx]) and writes its own effects in
// it; the transaction commits before the message is acknowledged. So:
//
//   - a duplicate finds its processed_messages row and is acknowledged with
//     no effect; the same message is still processed once by each consumer;
//   - a handler that fails leaves no row: the redelivery runs it again;
//   - a crash after the commit and before the acknowledgement redelivers a
//     message whose row exists: no second effect;
//   - Strict ordering (the default) applies version N only after N-1: an
//     older version is stale and skipped; a newer one is a gap: it is held in
//     dead_letters (so the stream keeps flowing: its predecessor may be right
//     behind it), tried again every GapRetryDelay by [Consumer.Run] until the
//     gap fills, and marked dead and reported after GapTimeout. LatestWins
//     applies any newer version and skips older ones;
//   - a handler that fails rolls its effects back; the message is parked in
//     dead_letters and retried by Run with jittered exponential backoff
//     (RetryBackoff, doubling up to RetryBackoffMax), then marked dead after
//     MaxAttempts. While an aggregate has a parked message, its later events
//     are held behind it, for this consumer only; other aggregates and other
//     consumers keep flowing. `outflow dlq list | retry | discard` manages
//     them.
//
// The bookkeeping costs one statement per message (one round trip) on top
// of the handler's transaction. Handlers with effects outside the database
// (an HTTP call) must not run them inside the transaction; see the
// NotifyMerchant handler for the pattern.
//
// [Retention] keeps the bookkeeping bounded: it purges processed_messages
// rows, and resolved or discarded dead_letters rows, older than its
// retention (15 days by default, the forwarder's retention of published
// outbox rows), in short batched transactions. It never purges
// consumer_aggregate_versions nor open dead letters: a redelivery older than
// the retention is recorded as new, and its version, at or below the stored
// one, is what still skips it as stale.
package idempotency
