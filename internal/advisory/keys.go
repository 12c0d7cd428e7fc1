package advisory

// Class is an advisory lock's class, the first key of PostgreSQL's two-key
// form (class, hashtext(current_schema())): each schema has its own lock of
// each. Every class of the product is here, "ou" and two letters in ASCII,
// no two alike (internal/layering's tests): two jobs sharing one would keep
// each other from running in the same schema.
type Class int32

// Elections: one instance per schema runs each round ([InTx], [Try]).
const (
	ForwarderPurge    Class = 0x6f757470 // "outp": forwarder.Purge
	OutboxPartitions  Class = 0x6f757471 // "outq": forwarder.EnsurePartitions
	RetireSet         Class = 0x6f757472 // "outr": the end of a forwarder.RepartitionOnline
	ConsumerRetention Class = 0x6f757464 // "outd": idempotency.Retention
	KeyExpiry         Class = 0x6f75746b // "outk": httpapi.KeyExpiry
	BodiesPurge       Class = 0x6f757462 // "outb": claimcheck.PurgeBodies (forwarders and WAL relay)
	WALAudit          Class = 0x6f757761 // "ouwa": the WAL relay's broker audit
	// ForwarderAudit ("outa"): the forwarder's broker audit, which runs on
	// the holder of partition 0; while partition 0 moves two instances may
	// both believe they hold it, and the lock keeps them from judging the
	// same receipts twice.
	ForwarderAudit Class = 0x6f757461
	// WebhookStats ("outw"): a session lock the exporter of the webhook
	// table gauges (handlers.Sender) holds for as long as it exports (see
	// the package's doc).
	WebhookStats Class = 0x6f757477
)

// Mutual exclusion, not elections: a taker waits for the holder.
const (
	Migrations          Class = 0x6f757466 // "outf": session lock, one migration run per schema at a time
	ForwarderRegister   Class = 0x6f757267 // "ourg": instances starting together register in turn
	EndpointsPerAccount Class = 0x6f757765 // "ouwe": webhooks/endpoints' Create, keyed by schema and account (MaxPerAccount)
)

// Locks of the one-key form, whose keys never meet the two-key form's: the
// forwarder's fence (forwarder/fence.go: the schema's hash high, the lease
// partition low), the WAL relay's reader (walrelay/slot.go: a session lock
// on the slot's name), and the sql broker's table creation (watermill-sql's).
