// Package walrelay is the read side of the outbox's WAL mode: it reads the
// logical decoding messages that an [outbox.Writer] in [outbox.ModeWAL]
// emits inside the producers' transactions, through a replication slot, in
// commit order, and publishes their events to the broker.
//
// # Reading
//
// The relay decodes with the built-in pgoutput plugin, asking for messages
// only (an empty publication, messages 'true'), so no row change of any
// table is sent to it. It reads in batches: pg_logical_slot_peek_binary_changes
// returns up to Config.MaxChanges changes of whole committed transactions,
// the relay publishes their events, and only then moves the slot with
// pg_replication_slot_advance, to the end of the last transaction whose
// every event the broker acknowledged (or that was copied into the parked
// table). A crash at any point leaves the slot behind what was published:
// the next reader publishes it again. Delivery is at least once; consumers
// deduplicate by message id.
//
// The slot is never confirmed inside a transaction: positions come from
// commit records the relay decoded. On a database that writes WAL but no
// outbox event, the relay emits a heartbeat message of its own now and
// then and confirms past it, so the slot does not hold WAL back.
//
// # One reader
//
// A session advisory lock, keyed by the slot's name, makes one relay the
// reader; the others stand by and try for it every Config.StandbyRetry. A
// reader that dies (even kill -9) loses its session, hence the lock, and a
// standby takes over from the slot's confirmed position.
//
// # Order and refusals
//
// Events are published in the forwarder's waves ([forwarder.PublishWaves]):
// an aggregate's next event never reaches the broker before the previous
// one was acknowledged. A broker outage ([forwarder.ErrBrokerUnavailable])
// is waited out with backoff and costs no attempt: the slot is not moved
// past it. An event the broker refuses for its own reason is copied, with
// its aggregate's later events, into outbox_wal_parked before the slot
// moves past it; the relay retries the head of each held aggregate there on
// the forwarder's schedule, and after MaxAttempts leaves it for an operator
// ([RetryParked], [DiscardParked]), as in table mode. Other aggregates go
// on.
//
// # History
//
// Every event read is also written to outbox_wal_history, while the broker
// publishes (never on the producers' path): an insert-only table
// partitioned by day, whose partitions are dropped whole past
// Config.HistoryRetention. Replay and repair read it (replay.Filter.Source).
//
// # Broker loss
//
// When the Broker is a [forwarder.Auditor], the relay keeps a receipt of
// where the broker put each event, keyed by its history row, in
// outbox_wal_receipts, written before the slot moves past the event. Every
// Config.AuditInterval the reading relay audits them with the forwarder's
// engine ([forwarder.RunAudit]); an event the broker lost is copied from
// the history into outbox_wal_parked and goes out again, before its
// aggregate's later events (the parked events go out in commit order), its
// discard marker instead when it was discarded ([Relay.Audit]).
//
// # Slot safety
//
// A slot keeps the WAL its reader has not confirmed: a relay that is down
// makes the primary's pg_wal grow. Bound it with max_slot_wal_keep_size; a
// slot that passes it is invalidated (wal_status "lost") and its events
// can no longer be read. The relay exports the slot's lag, safe_wal_size
// and wal_status, and treats a lost slot, or a slot it recorded in
// outbox_wal_slots that is gone, as [ErrSlotLost]: it logs an error, sets
// slot_wal_status{status="lost"|"missing"}, fails [Relay.Ready], and never
// creates the slot again on its own. [RecoverSlot] (`outflow relay
// recover-slot`) records the lost WAL range and creates a new slot. See
// docs/wal-mode.md.
package walrelay
