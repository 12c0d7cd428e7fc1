// Package replay re-delivers retained outbox rows to one consumer, and
// resets a consumer's bookkeeping for chosen aggregates so that a replay
// applies their events again: together, the way to rebuild a projection
// (docs/replay.md).
//
// A replay goes through the broker, not around it: [Publish] builds each
// row's message with forwarder.Message (the bytes the forwarder published)
// and publishes it, in id order, to the consumer's replay topic
// (consumer.ReplayTopic), which only that consumer's group reads, through
// the same idempotency middleware as its topic. So a replay reaches one
// consumer and leaves the others untouched, and it re-applies nothing the
// consumer has already handled (its aggregate versions: a message at or
// below one is a duplicate or stale) unless [ResetConsumer] forgot it
// first.
//
// [ResetConsumer] deletes, in one transaction, the consumer's open dead
// letters of the aggregates (and the processed_messages rows consumers
// wrote before migration 00026), and sets its aggregate versions back to 0,
// marked reset; the caller's [Reset.Also] runs in the same transaction,
// after the aggregates are locked against the consumer, to delete the
// projection's own rows, so no event is counted twice or lost however the
// consumer runs meanwhile. The mark keeps idempotency.Config.BaselineBefore
// off the aggregates until their version 1 applies: a live event that
// arrives before the replay waits for it (dead-lettered after GapTimeout,
// healed when the replay comes) instead of becoming the baseline that
// would make the replayed versions stale.
//
// Only rows the outbox still holds can be replayed (its retention, 15 days
// by default), and only rows that were published. An aggregate whose
// first versions were purged cannot be rebuilt from version 1: after a
// reset, its first retained event is a gap for a Strict consumer, with or
// without BaselineBefore, dead-lettered after GapTimeout; the reset counts
// and names such aggregates ([ResetResult.Purged]).
//
// This package is framework: it imports no application code.
package replay
