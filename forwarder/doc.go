// Package forwarder moves committed outbox rows to a broker (Redis Streams
// by default, see package brokers/redis): at least once, never lost, never
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
//     higher id did. (The claim's low-water mark, below, is a lower bound
//     that never passes an id a transaction could still commit, not a
//     cursor.) Watermarks (design C) are faster but stall every
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
// retry` puts them back in line ([RetryParked]), `outflow outbox discard`
// gives up on them ([DiscardParked]): the forwarder then publishes a
// discard marker in each one's place (see [Message]), which keeps the
// version in its aggregate's stream, so that consumers applying versions in
// order go on with the later ones instead of waiting for it.
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
// # How the forwarder learns of new rows
//
// Nothing in a producer's transaction tells it: a transaction that has
// queued a NOTIFY takes an instance-wide lock at commit, so that
// notifications are delivered in commit order, and that serialises every
// notifying commit of the PostgreSQL instance. Until migration 00010 an
// AFTER INSERT trigger on outbox did exactly that; `outflow-bench pay` at
// 16 clients measured 0.56-0.69x of the throughput without the outbox
// (0.85-0.88x with the trigger dropped and nothing else changed), and the
// loss grows with concurrency (docs/benchmarks.md).
//
// Instead the forwarder polls, adaptively:
//
//   - After a claim that found rows it claims again at once: under load it
//     never waits, as when every commit notified it.
//   - After a claim that found none it waits MinPollInterval (2 ms), then
//     looks; each look that finds nothing doubles the wait, up to
//     PollInterval (250 ms), but only up to 16 ms within a second of the
//     last row found: under a steady flow, commits come with gaps, and a
//     wait doubled across a gap cost p99 latencies of 120-210 ms. Any row
//     found brings the wait back to MinPollInterval.
//   - A look is a probe, one statement outside any transaction on the
//     pending-rows partial index (parked rows and retries not yet due do not
//     count), not the claim: measured with pgbench on an empty outbox, 0.26-0.36 ms
//     against 1.6-1.8 ms for the claim's transaction, which also locks the
//     lease rows (a write). The probe ignores partitions: a row of another
//     instance's partition costs this one an empty claim, and its wait keeps
//     growing.
//   - [Forwarder.Wake] is the in-process signal: a writer sharing the
//     forwarder's process calls it after its commit and the forwarder looks
//     at once. `outflow serve --roles api,forwarder` wires it through
//     app.Config.AfterCommit. Wakes coalesce and never block; a missed one
//     costs latency, never a row, because the poll always runs.
//
// What it costs, measured (docs/benchmarks.md): on a quiet 2-core machine
// at a steady 1,000 events/s, commit-to-stream p99 11-12 ms. With 2 cores
// shared with other benchmarks: at a steady 1,000 events/s commit-to-stream p50
// 3.7-10.0 ms and p99 37.8-45.1 ms in three runs of four (74.7 ms in the
// busiest), against 3.3-7.8 ms and 23.9-50.3 ms for the old trigger in the
// same runs: a few milliseconds more, for the producers' throughput. Draining a backlog runs at 1.04 of the raw loop. A
// row committed after a quiet spell waits at most PollInterval, plus a
// claim, unless Wake is called.
// An idle forwarder costs the database, measured with scripts/idle-cost.sh:
// one forwarder 5-6 transactions/s (the probe 4 times a second, the lease
// tick every 2 s, the stats every 5 s) and about 1 ms of backend CPU per
// second; three, 14-20 transactions/s and 4 ms/s. The LISTEN design it
// replaces (a claim every second): 3 and 10 transactions/s, 0.7 and 3 ms/s.
// A trickle of about one row a second keeps the forwarder in its busy
// window: some 60 probes a second, about 2% of a core by the probe's
// pgbench cost.
// A longer PollInterval cuts the probes, at the price of the first row
// after a quiet spell.
//
// Options weighed and not taken: a NOTIFY sent after the producer's commit
// by a statement of its own (no commit-order lock on the producer's
// transaction, but a round trip and a lock on every command, for what the
// in-process wake gives free where writer and forwarder share a process);
// logical decoding (needs wal_level=logical, this machine has replica, and
// a slot retains WAL without bound while the forwarder is down).
//
// # PgBouncer
//
// The forwarder holds no session state (no LISTEN, no session settings:
// lock_timeout and synchronous_commit are set per transaction), so it works
// behind PgBouncer in transaction pooling mode, producers too. pgx's default
// named prepared statements need PgBouncer 1.21 or later with
// max_prepared_statements set; with an older one put
// default_query_exec_mode=exec (or simple_protocol) in DATABASE_URL.
// PgBouncer does not pass search_path through: set it on the role or in
// PgBouncer's database entry (connect_query). Tested through a real
// PgBouncer 1.18 (TestThroughPgBouncerTransactionPooling).
//
// # Claim cost: a low-water mark, so dead index entries are not walked
//
// Marking a row published removes it from outbox_pending_idx only when
// vacuum runs; until then its entry stays, dead, at the head of the index,
// and a claim that walks the index from its head walks them all. On a large
// table autovacuum comes rarely (at a fifth of the table dead by default).
// Measured before this design: 20,000 rows drained in 0.54 s behind no dead
// entry, 0.83 s behind 1 million, 1.54 s behind 5 million (about 25 ms per
// 500-row claim: some 13,500 index pages of killed entries), and a 5
// million backlog drained at a third of a 1 million one's rate.
//
// So each instance keeps a low-water mark L in memory and its claim starts
// above it (id > L): an index range scan that begins past the dead entries.
// L may only pass an id once no row with that id can still become
// claimable through the index. Two things could make one:
//
//   - A transaction still open that drew a lower id (ids are drawn at
//     insert, rows appear at commit). The horizon: read S0, the id
//     sequence's last value, then take a transaction id X0 (pg_current_xact_id
//     in a transaction that has none yet, so X0 is newer than every
//     transaction id assigned before). Once the oldest running transaction
//     is newer than X0 (pg_snapshot_xmin of the current snapshot > X0),
//     every transaction that drew an id <= S0 has ended, provided each got
//     its transaction id before its row id. A column default runs in column
//     order and nextval alone does not assign a transaction id, so
//     migration 00011 makes the id default call pg_current_xact_id() before
//     nextval (a plain CACHE 1 sequence replacing the identity, values kept).
//     A snapshot's xmax is not enough for X0: a transaction can hold an id at
//     or above it while running.
//   - Rows below L that need the claim again: a row waiting for its retry
//     (next_attempt_at set) and a parked row put back by RetryParked. Both
//     are in outbox_blocked_idx, which is small, and the claim's second
//     branch takes due rows from there wherever they are. RetryParked makes
//     the released row due (next_attempt_at = now()) rather than new, and
//     makes the later pending rows of its aggregate, held behind it, due
//     too, so they are found there as well, after it, in id order.
//
// L advances to min(S0, m - 1), where m is the smallest id above L of a
// pending row that is neither blocked nor held behind a parked row, found
// in the statement whose snapshot confirmed the horizon. Rows held behind a
// row waiting for a retry count in m: they stay above L, and are claimed as
// usual once that row is published. Per-aggregate order is untouched: the
// claim still holds an aggregate's later rows behind any blocked one, and
// no row of an aggregate can be below L while a later one is claimable.
// The walk that finds m starts at L, so each dead entry is walked about
// once, not once per claim. A round costs one transaction id and two tiny
// statements in the claim's own transaction (no extra round trip): one
// batch opens it, a later one closes it. An idle forwarder opens none.
//
// The horizon waits for every transaction in the cluster, not only the
// outbox's writers: a long write transaction anywhere holds L where it is
// (rows still flow; claims then walk the entries dead since). A restart
// starts L at 0. And the safety net: every FullClaimInterval (default 1m)
// one claim ignores L, so a row the mark passed by a bug or by hand (an
// UPDATE clearing parked_at) is delayed by at most that, never stranded;
// such a claim walks the dead entries once.
//
// Alternatives weighed: per-table autovacuum settings (a lower
// autovacuum_vacuum_scale_factor on outbox) would bound the dead entries in
// production, but each vacuum also scans every index of a table kept for 15
// days, and the claim's cost would still follow vacuum's pace; none is
// shipped, nothing here needs it. A layout where publishing leaves nothing
// in the claim's path (a separate pending table whose rows are deleted on
// publish) leaves the same dead entries in that table's index: deletes are
// removed by vacuum too. Measured with the mark, autovacuum off: 20,000
// rows behind 5 million dead entries in 0.99x the clean time, and a 5
// million backlog drained at 0.73-0.96x of a 1 million one's rate (three
// runs; sampled every 10 s, the rate does not fall as the drain goes
// deeper). Figures: docs/benchmarks.md, "Claim cost without vacuum"
// (`outflow-bench claim-dead`).
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
// forwarded, failed and parked totals by topic, publish and batch latencies
// and, per partition, whether this process holds it (partition_held) are
// exported too (see [ReadStats] and Config.Registerer). The outbox gauges
// describe the whole table, so only the holder of partition 0 exports them
// (stats_exporter 1; the others export 0) and a sum over instances is the
// table's. Forwarders of one process given the same Registerer share the
// collectors, so counters, histograms, partitions_owned and partition_held
// are the process's sums. A long open write
// transaction does not delay this forwarder (it claims committed rows, not
// a snapshot watermark); it only holds the claim's low-water mark in place.
//
// # When the broker loses what it acknowledged
//
// A broker that comes back with less than it acknowledged (a Redis failover
// to a replica that had not caught up, a restart without persistence, a NATS
// stream that lost its tail, a Kafka topic recreated) leaves rows marked
// published that no consumer will read. When the Broker is an [Auditor],
// the mark of a batch also keeps, in outbox_receipts, where the broker put
// each row (its [Receipt]), and every Config.AuditInterval (20s; negative
// disables) the instance holding partition 0 hands the receipts no consumer
// has settled yet to [Auditor.Check]: what the broker lost it puts back, in
// the audit's transaction, row by row, and the normal claim publishes them
// again (every instance lowers its low-water mark to the first of them);
// what every consumer had it forgets. Detection rests on those receipts,
// so a loss before the first audit, across a restart of every forwarder
// or after a failed audit is found by the next audit. Consumers
// deduplicate, so a repair applies nothing twice. Each repair counts
// outflow_forwarder_broker_losses_total and
// outflow_forwarder_repaired_total and logs one Warn line; see
// docs/broker-loss.md for what each backend can and cannot see.
//
// The partition count changes with [Repartition] (`outflow outbox
// repartition`), which refuses while any forwarder runs: one with a live
// heartbeat in outbox_forwarders, whether or not it holds a lease. An
// instance that was only silent that long and comes back finds the new
// count and leases nothing (it logs [ErrPartitionsMismatch]) until it is
// restarted with it.
package forwarder
