// Package forwarder moves committed outbox rows to a broker (Redis Streams
// by default, see package redisstreams): at least once, never lost, never
// skipped, in order per aggregate, with poison rows parked instead of
// blocking the rest.
//
// # Design: claim, publish, mark, over leased partitions
//
// Of the three designs we weighed (claim and mark; claim and delete;
// per-partition watermarks), this is the first, over partitions leased to
// instances. Why:
//
//   - Claiming by state (published_at IS NULL through a partial index), never
//     by an id cursor, cannot skip a row whose transaction committed after a
//     higher id did. Watermarks (design C) are faster but stall every
//     partition behind any long write transaction in the database, and need a
//     side table for parked rows; delete-on-publish (design B) needs an
//     archive for retention and replay. Marking costs one non-HOT UPDATE per
//     row; measured, the forwarder still moves ~20k rows/s on 2 cores
//     (docs/benchmarks.md), far above what the producers commit.
//   - Per-aggregate order across instances needs one aggregate in one hand
//     at a time. Rows are spread over Config.Partitions partitions by a hash
//     of their aggregate id; each partition is leased to one instance
//     (outbox_partitions), instances share them fairly (outbox_forwarders
//     heartbeats) and take over the partitions of an instance that stopped
//     renewing within TakeoverAfter + LeaseRenewInterval (default 12 s).
//   - One transaction per batch: claim (SELECT ... FOR UPDATE), publish the
//     batch in waves (below), mark what the broker acknowledged, commit.
//     A crash anywhere before the commit rolls the claim back and the rows
//     are published again: a duplicate with the same message id, never a
//     loss. The transaction is bounded (PublishTimeout, lock_timeout) and
//     never spans a retry sleep.
//   - The claim locks its partitions' lease rows FOR SHARE, so a takeover
//     waits for the batch in flight, and it locks rows with plain FOR UPDATE
//     rather than SKIP LOCKED: within a partition a locked row can only
//     belong to a previous owner finishing its batch, and skipping it would
//     publish that aggregate's later events first. SKIP LOCKED is used where
//     it is right: instances acquiring free partitions.
//
// # Waves: order whatever the broker does with each message
//
// A batch goes to the broker in waves, one Broker.Publish call (one
// pipeline) each: wave k holds the k-th row, in claim (id) order, of every
// aggregate present in the batch. After a wave, an aggregate whose row
// failed (for its own reason or the broker's) is blocked: its later rows in
// the batch are not sent and stay pending without an attempt counted. So an
// aggregate's next event is never handed to the broker before the previous
// one was acknowledged, whether the broker refuses one record (Kafka's
// max.message.bytes, a JetStream stream's MaxMsgSize), fails one ack, or
// retries. A batch costs as many round trips as the most rows one aggregate
// has in it: one at steady state, more only while a backlog is piled up
// behind a few aggregates. PublishTimeout covers all the waves of a batch:
// a wave whose turn comes after it is not sent, and its rows stay pending,
// as in a broker outage.
//
// # Failures
//
// A row that fails for its own reason (its metadata cannot be encoded, the
// broker refuses the entry) counts an attempt and is retried
// after a jittered exponential backoff (RetryBackoff doubling up to
// RetryBackoffMax); after MaxAttempts it is parked with its last_error (at
// most 2,000 bytes, cut on a character boundary). While a row waits or is
// parked, the later rows of its aggregate wait behind it; other aggregates
// keep flowing. `outflow outbox parked` lists parked rows, `outflow outbox
// retry` puts them back in line.
//
// "Too large" is decided before sending, against the effective limit: the
// smaller of MaxPayloadBytes (on the payload) and the broker's own limit on
// one message, for brokers that have one ([PayloadLimiter]: Kafka's producer
// MaxMessageBytes, NATS's max_payload, the tighter side of a Tee), counted
// as the broker counts it (payload, headers, key). Such a row never reaches
// the broker; it is parked at its first attempt (no retry makes it fit), its
// error naming both limits and the one that applied. A limit
// the forwarder cannot see (a Kafka topic's max.message.bytes below the
// producer's) is met as the broker's refusal of that row.
//
// A broker outage is not the rows' fault: errors wrapping
// [ErrBrokerUnavailable] leave the rows pending with their attempts
// untouched; the forwarder backs off (up to OutageBackoffMax) and drains the
// backlog when the broker is back.
//
// # Latency
//
// An AFTER INSERT trigger notifies the channel "outflow_outbox:<schema>" when
// rows commit; the forwarder LISTENs on it and claims at once. Polling
// (PollInterval, default 1 s) is only the fallback: for a lost LISTEN
// connection and for rows whose retry became due.
//
// # Operations
//
// Published rows are kept for Retention (default 15 days) and purged in
// batches of PurgeBatchSize rows, each its own short transaction, walking
// the table in id order from the oldest row. For very high volume, partition
// the outbox table by created_at (PostgreSQL declarative partitioning) and
// drop old partitions instead: dropping a partition costs nothing per row.
//
// The one alert to set is the age of the oldest pending row
// (outflow_outbox_oldest_pending_age_seconds); pending and parked counts,
// forwarded totals, attempts and publish and batch latencies are exported
// too (see [ReadStats] and Config.Registerer); forwarders of one process
// given the same Registerer share the collectors, so counters, histograms
// and partitions_owned are the process's sums. A long open write
// transaction does not delay this forwarder (it claims committed rows, not
// a snapshot watermark).
//
// The partition count changes with [Repartition] (`outflow outbox
// repartition`), which refuses while any forwarder runs: one with a live
// heartbeat in outbox_forwarders, whether or not it holds a lease. An
// instance that was only silent that long and comes back finds the new
// count and leases nothing (it logs [ErrPartitionsMismatch]) until it is
// restarted with it.
package forwarder
