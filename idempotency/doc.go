// Package idempotency makes a Watermill handler safe on an at-least-once,
// possibly reordered stream: a duplicate delivery changes nothing, and each
// aggregate's events are applied in version order.
//
// [Middleware] opens a transaction in the consumer's database for every
// message and, in one statement, checks the message's aggregate_version
// against the last one this consumer applied for that aggregate, whose row
// in consumer_aggregate_versions it locks for the transaction and moves to
// the message's version when it applies. That row is the consumer's only
// bookkeeping: an aggregate has one event per version, so a message at the
// stored version is the one applied last, delivered again (a duplicate),
// and one below it is stale, however old; nothing is written per message.
// The handler then runs with that transaction in its context ([Tx]) and
// writes its own effects in it; the transaction commits before the message
// is acknowledged. So:
//
//   - a duplicate is acknowledged with no effect, whenever it comes; the
//     same message is still processed once by each consumer (each has its
//     own version rows);
//   - a handler that fails leaves the version as it was: the redelivery
//     runs it again;
//   - a crash after the commit and before the acknowledgement redelivers a
//     message at or below the stored version: no second effect;
//   - a redelivery of a message parked in dead_letters (for a retry, or held)
//     is the one case the version cannot tell, since its version may be
//     exactly the next one: the statement finds its open dead letter by
//     (consumer, message_id), a read that writes nothing, and it is a
//     duplicate;
//   - Strict ordering (the default) applies version N only after N-1: an
//     older version is stale and skipped; a newer one is a gap: it is held in
//     dead_letters (so the stream keeps flowing: its predecessor may be right
//     behind it), tried again every GapRetryDelay by [Consumer.Run] until the
//     gap fills, and marked dead and reported after GapTimeout. A gap that
//     timed out still heals: if its predecessor arrives and applies later,
//     it and the events held behind it apply, in order, with no operator.
//     Held events right behind a message that applies apply in that
//     message's transaction (the statement that checks the versions reads
//     them, once the aggregates' locks are taken), each in a savepoint;
//     LatestWins applies any newer version and skips older ones;
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
// handled as an event whose handler does nothing: its version applied
// through the same ordering (held when early, applied in
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
// a held event that can apply waiting. The round's held events (whose
// handler never failed) run in one transaction, each in a savepoint; a row
// whose handler failed before runs alone, one attempt per round. A commit
// that leaves a parked event due (a held event whose handler failed behind
// its predecessor, an early message of a batch whose predecessor the batch
// applied) wakes Run rather than leaving it to RetryPollInterval. Several
// instances of one consumer (processes) may run at once; rows are claimed
// with SKIP LOCKED.
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
// transaction, and under 300 bytes of WAL per event (docs/benchmarks.md,
// `outflow-bench consumer-wal`): an aggregate's first event inserts its row,
// the next ones update it in place (heap-only: no index entry; the table's
// fillfactor is 70), whatever the number of rows kept. Handlers with effects outside the database (an HTTP call)
// must not run them inside the transaction; see the NotifyMerchant handler
// for the pattern.
//
// [Retention] keeps the bookkeeping bounded: it purges resolved or
// discarded dead_letters rows older than its retention (15 days by default,
// the forwarder's retention of published outbox rows), in short batched
// transactions, and empties processed_messages (written by consumers before
// migration 00026, read by nothing now) in one TRUNCATE once its newest row
// is past the retention: never row by row. It never purges
// consumer_aggregate_versions nor open dead letters: the versions are what
// skip a redelivery, however old. They grow with the aggregates (a row per
// consumer and aggregate), not with the traffic.
//
// With Config.Metrics set, a consumer counts its outcomes where it decides
// them, once their transaction committed: outflow_consumer_handled_total,
// _duplicates_total, _stale_total, _held_total, _retried_total (a failure
// scheduled for a retry), _dead_total and the histogram
// outflow_consumer_handling_seconds, labelled consumer and topic. Consumers
// of one process share the collectors. Nil Metrics costs a nil check.
package idempotency
