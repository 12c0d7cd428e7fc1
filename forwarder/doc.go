// Package forwarder moves committed outbox rows to a broker (Redis Streams
// by default, see package brokers/redis): at least once, never lost, never
// skipped, in order per aggregate, with poison rows parked instead of
// blocking the rest.
//
// # Design: a cursor per partition, no mark on the rows
//
// An event costs the database its INSERT and, on the normal path, nothing
// after it: the forwarder never writes to a row it publishes. Each of
// Config.Partitions partitions (a hash of the aggregate id) has a cursor
// (outbox_partitions.published_through): every committed row of the
// partition at or below it was published, or is in outbox_failures. Only
// rows off the normal path have per-row state, in that small table: a row
// the broker refused (attempts, last_error, next_attempt_at, parked_at), a
// row held behind one, a row the broker lost (see below). Why:
//
//   - The mark it replaces (a non-HOT UPDATE of the whole row, three index
//     insertions, full-page images of random index pages that grow with the
//     history, and the dead tuple and six index entries vacuum then
//     removes) cost 1-3.3 KB of WAL per event on top of the INSERT's ~770 B,
//     and a pending-rows index walked through its dead entries. With the
//     cursor an event writes nothing after its INSERT: `outflow-bench
//     event-cost` (docs/benchmarks.md).
//   - A cursor must never pass a row whose transaction can still commit:
//     ids are drawn in one order and committed in another. The claim learns
//     which transactions are running and tracks them; see "Cursors" below.
//     A long transaction holds back only its own rows, never the rest.
//   - Per-aggregate order across instances needs one aggregate in one hand
//     at a time. Each partition is leased to one instance
//     (outbox_partitions), instances share them fairly (outbox_forwarders
//     heartbeats) and take over the partitions of an instance that stopped
//     renewing within TakeoverAfter + LeaseRenewInterval (default 12 s). A
//     new holder starts at the recorded cursor.
//   - One transaction per batch: read the partitions' rows above the
//     cursor (and the due rows of outbox_failures), publish them in waves
//     (below), record what failed, commit, then move the cursor in memory.
//     The lease loop records the cursor (published_through,
//     published_high, waiting_xids) at each tick, in the lease row it
//     renews anyway: one small UPDATE per partition per tick whatever the
//     rows published. A crash loses at most a tick of cursor: those rows
//     are published again, a duplicate with the same message id, never a
//     loss. The transaction is bounded (PublishTimeout, lock_timeout) and
//     never spans a retry sleep.
//   - The claim holds a fence on its partitions (a transaction-scoped
//     advisory lock, which writes no WAL, unlike a row lock on the lease
//     rows): an instance taking over an expired lease only tries it, and
//     skips a partition whose batch is still out; a release, the
//     retirement of a partition set and a repartition wait for it.
//
// Designs weighed: claim and mark (the one this replaces, above); claim
// and delete (needs an archive for retention and replay, and leaves as
// many dead tuples); a snapshot watermark that waits for every running
// transaction (stalls every partition behind any long transaction in the
// cluster); logical decoding, offered beside this as a mode of its own
// where the highest rates justify a replication slot.
//
// # Waves: order whatever the broker does with each message
//
// A batch goes to the broker in waves, one Broker.Publish call (one
// pipeline) each: wave k holds the k-th row, in claim (id) order, of every
// aggregate present in the batch. After a wave, an aggregate whose row
// failed (for its own reason or the broker's) is blocked: its later rows in
// the batch are not sent; they wait in outbox_failures as held rows,
// untried, without an attempt counted (in a broker outage they are simply
// read again). So an
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
// broker refuses the entry) enters outbox_failures, counts an attempt and
// is retried
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
//   - A look is a probe, one statement outside any transaction (a row above
//     the cursor, a due row of outbox_failures, a tracked transaction now
//     committed), not the claim: measured with pgbench on an empty outbox, 0.26-0.36 ms
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
// # Cursors
//
// Rows are read in id order above each partition's high, the in-memory
// cursor (published_through is its durable, more cautious copy). An id is
// drawn after its transaction has a transaction id: migration 00011 makes
// the id default call pg_current_xact_id() before nextval (a column default
// alone draws first, and nextval assigns no transaction id). A claim reads
// L, the id sequence's last value, then the transactions running (each
// holds a lock on its own transaction id: pg_locks), then takes its
// snapshot. A row with an id at or below L that the snapshot does not show
// belongs to one of the running transactions. (The snapshot's own list of
// transactions in progress would not do: it omits those at or above its
// xmax, which may be running and may have drawn ids below L.) Such a
// transaction is tracked with a bound below every id it can have drawn (L
// of the claim before the one that first saw it running); once a snapshot
// shows it committed, its rows between its bound and the highs are read by
// transaction id (its late rows: a primary-key range scan between the two,
// no index of their own, which every INSERT would pay for) in the same
// batch as the rows above, in id order, so an aggregate's order holds. The highs move to L; rows read above L (committed between the
// reads) are remembered and skipped until the highs pass them.
//
// The durable cursor recorded for a partition is the lowest of its high
// and the bounds of the transactions tracked; published_high and
// waiting_xids record the rest (every row at or below published_high is
// published but those of waiting_xids), for the tools' view (outbox_state).
// A transaction that runs long holds back only the durable cursor, which
// only costs duplicates after a crash. Every 200 ms, while one holds it
// back, the claim asks which running transactions hold a lock on the
// outbox or one of its partitions: one that does not has written no row
// yet, so its bound moves up to L, and a transaction of another table or
// database holds nothing back however long it runs. The question is asked
// after L is read and before the snapshot is taken: a committing
// transaction releases its table locks before the lock on its transaction
// id, and leaves the running ones (as snapshots see them) before either,
// so one caught between the two releases already shows committed in the
// snapshot, which reads its rows from its old bound. (Asked after the
// snapshot, such a writer looked like a transaction of another table and
// its rows were skipped.)
//
// A row that needs the claim again below the cursor (a failure due for its
// retry, a parked row put back by RetryParked, a held row, a row the
// broker lost) is in outbox_failures, which the claim reads first, in id
// order, with the rows above the cursor.
//
// # Operations
//
// Published rows are kept for Retention (default 15 days). The outbox is
// partitioned by id range (migration 00028), HistoryPartitionSize ids a
// partition (default 10 million), and retention drops a partition whole
// (DROP TABLE: no row deleted, no dead tuple, nothing for vacuum, about a
// byte of WAL per event) once every row in it is published, none is in
// outbox_failures and its newest row is older than Retention; the purge
// loop also keeps two partitions ahead of the ids (EnsurePartitions). A
// parked row keeps its partition until it is retried or discarded. Ids
// that outrun the partitions (no forwarder ran for that long) land in
// outbox_default, whose rows are deleted one by one, in batches of
// PurgeBatchSize. Retention is by the newest row of a partition, so rows
// stay up to a partition's span longer than Retention.
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
// a snapshot watermark); it only holds the durable cursor in place.
//
// # When the broker loses what it acknowledged
//
// A broker that comes back with less than it acknowledged (a Redis failover
// to a replica that had not caught up, a restart without persistence, a NATS
// stream that lost its tail, a Kafka topic recreated) leaves rows counted
// published that no consumer will read. When the Broker is an [Auditor],
// outbox_receipts keeps where the broker put each row (its [Receipt]),
// written by the lease tick that records the cursor past the row, in one
// row for every batch since the last tick (until then a crash publishes the
// row again, so nothing the broker took goes unaudited; a row retried from
// outbox_failures has its receipt written with its batch), and every Config.AuditInterval (20s; negative
// disables) the instance holding partition 0 hands the receipts no consumer
// has settled yet to [Auditor.Check]: what the broker lost it puts back, in
// the audit's transaction, as rows of outbox_failures (kind repair), which
// the claims of their partitions' holders publish again;
// what every consumer had it forgets. Detection rests on those receipts,
// so a loss before the first audit, across a restart of every forwarder
// or after a failed audit is found by the next audit. Consumers
// deduplicate, so a repair applies nothing twice. Each repair counts
// outflow_forwarder_broker_losses_total and
// outflow_forwarder_repaired_total and logs one Warn line; see
// docs/broker-loss.md for what each backend can and cannot see.
//
// The partition count changes with the forwarders running
// ([RepartitionOnline], `outflow outbox repartition --partitions N`): rows
// from the next id on map to a new set of partitions, which takes over
// once every row of the old set is published, so an aggregate's order
// holds across the change; new events wait meanwhile, about two lease
// intervals. Instances follow the database's count whatever their
// Config.Partitions, which only makes the first set. [Repartition] does
// it offline, refusing while any forwarder runs.
package forwarder
