// Package idempotency makes a Watermill handler safe on an at-least-once,
// possibly reordered stream: a duplicate delivery changes nothing, and each
// aggregate's events are applied in version order.
//
// [Middleware] opens a transaction in the consumer's database for every
// message and, in one statement, records (message_id, consumer) in
// processed_messages and checks the message's aggregate_version against the
// last one this consumer applied for that aggregate, whose row in
// consumer_aggregate_versions it locks for the transaction. The handler
// then runs with that transaction in its context ([Tx]) and writes its own
// effects in it; the transaction commits before the message is
// acknowledged. So:
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
//     gap fills, and marked dead and reported after GapTimeout. A gap that
//     timed out still heals: if its predecessor arrives and applies later,
//     Run applies it and the events held behind it, in order, with no
//     operator. LatestWins applies any newer version and skips older ones;
//   - a handler that fails rolls its effects back; the message is parked in
//     dead_letters and retried by Run with jittered exponential backoff
//     (RetryBackoff, doubling up to RetryBackoffMax), then marked dead after
//     MaxAttempts: such a row waits for an operator. While an aggregate has a
//     parked message, its later events are held behind it, for this consumer
//     only; other aggregates and other consumers keep flowing. The check
//     reads dead_letters after the aggregate's lock is taken (in a snapshot
//     of its own), so a message parked by a transaction that held the lock
//     before is seen. `outflow dlq list | retry | discard` manages them.
//
// A discard marker (event type [events.EventTypeDiscarded]: what the
// forwarder publishes in place of an outbox row an operator discarded) is
// handled as an event whose handler does nothing: recorded processed, its
// version applied through the same ordering (held when early, applied in
// order), the wrapped handler never called. The aggregate's later events
// then apply as if the discarded one had.
//
// The transaction's own statements (the bookkeeping, the queued
// statements, the commit) do not take the message context's deadline: a
// deadline set around the handler (Watermill's Timeout middleware) bounds
// what the handler runs with ctx, and a handler that returns nil past it
// is committed, not parked for a retry.
//
// Each round of Run looks at every due row (up to 500 per round, the next
// round starting at once when one was full): a gap still open does not keep
// a held event that can apply waiting. Several instances of one consumer
// (processes) may run at once; rows are claimed with SKIP LOCKED.
//
// A consumer added after the streams were trimmed never sees the first
// versions of the aggregates that existed before it; in Strict order it
// would hold each of their events as a gap, then dead-letter it.
// Config.BaselineBefore (opt-in, set it to the time the consumer is first
// deployed) lets it start: for an aggregate it has applied nothing of, an
// event that occurred before the cut-off is the aggregate's baseline and
// applies whatever its version; an event after the cut-off is strict from
// version 1, so a new aggregate's version 2 arriving first waits for its
// version 1 as usual; and if that wait reaches GapTimeout (an old aggregate
// whose earlier history was trimmed, touched again after the cut-off), the
// event becomes the baseline instead of dead. The trade-offs: an
// aggregate's version older than its baseline that arrives after it is
// skipped as stale (a reorder around the cut-off, or a redelivery), and a
// new aggregate whose version 1 never arrives within GapTimeout starts at
// its next version rather than staying dead.
//
// An aggregate that `outflow consumer reset` (replay.ResetConsumer) made the
// consumer forget is not one it has never seen: its row in
// consumer_aggregate_versions is set back to version 0 and marked
// (reset_at), and until its version 1 applies it takes no baseline, at
// first sight or after GapTimeout. Its history starts again at version 1,
// which the replay brings, whenever that comes: a live event that arrives
// first waits as a gap, is dead-lettered after GapTimeout (its error says
// the aggregate was reset), and heals once the replay applied its
// predecessors. Taking it as the baseline would make every replayed
// version stale, silently. An aggregate whose first versions the outbox no
// longer holds stays dead so, for an operator (docs/replay.md).
//
// The bookkeeping costs one statement per message (one round trip, or one
// per batch of messages sharing a transaction) on top of the handler's
// transaction. Handlers with effects outside the database (an HTTP call)
// must not run them inside the transaction; see the NotifyMerchant handler
// for the pattern.
//
// [Retention] keeps the bookkeeping bounded: it purges processed_messages
// rows, and resolved or discarded dead_letters rows, older than its
// retention (15 days by default, the forwarder's retention of published
// outbox rows), in short batched transactions. It never purges
// consumer_aggregate_versions nor open dead letters: a redelivery older than
// the retention is recorded as new, and its version, at or below the stored
// one, is what still skips it as stale.
//
// With Config.Metrics set, a consumer counts its outcomes where it decides
// them, once their transaction committed: outflow_consumer_handled_total,
// _duplicates_total, _stale_total, _held_total, _retried_total (a failure
// scheduled for a retry), _dead_total and the histogram
// outflow_consumer_handling_seconds, labelled consumer and topic. Consumers
// of one process share the collectors. Nil Metrics costs a nil check.
package idempotency
