package forwarder

import (
	"context"
	"time"
)

// Auditor is implemented by a [Broker] that can tell whether it still
// holds the messages it acknowledged: a Redis failover to a replica that
// had not caught up, a Redis restarted without persistence, a NATS stream
// that lost its tail, a Kafka topic deleted and recreated.
//
// When the broker is an Auditor and Config.AuditInterval is positive, the
// forwarder publishes with PublishReceipts and keeps each receipt in
// PostgreSQL (table outbox_receipts): in the lease tick that records the
// cursor past the row (until then, a crash publishes the row again), or,
// for a row retried from outbox_failures, in the transaction that takes it
// out of there. The forwarder that holds partition 0 then hands the receipts
// not yet settled to Check, every AuditInterval: what the broker lost is
// published again, what every consumer has is forgotten. Detection thus
// rests on what PostgreSQL durably knows it published and where, not on
// the memory of a process nor on an earlier audit: a loss before the first
// audit, across a restart of every forwarder, or after an audit that
// failed is found by the next audit that runs.
//
// [brokers/brokertest.RunAudit] is the contract an implementation must
// pass.
type Auditor interface {
	Broker
	// PublishReceipts is Publish that also tells where the broker put each
	// message it acknowledged: receipts[i] is msgs[i]'s when errs[i] is
	// nil. Both slices have len(msgs) elements.
	PublishReceipts(ctx context.Context, msgs []Outgoing) (receipts []Receipt, errs []error)
	// Check looks on one broker topic for the messages of held (receipts
	// of that broker topic not yet settled, with their message ids, in no
	// particular order) and judges each one: see [Status]. prev is the
	// State the previous Check of the broker topic returned (nil the first
	// time, or when it was lost); the forwarder keeps the returned State in
	// PostgreSQL for the next call, in the transaction that records the
	// verdict: a Check whose audit rolls back is followed by one given the
	// same prev. partial says the forwarder holds more unsettled receipts
	// than it handed over (it bounds one audit's work): Check must then
	// remove nothing from the broker, since it cannot know what it was not
	// shown.
	//
	// Check must never call Lost a message that every consumer had
	// acknowledged before it went (normal trimming, retention, a deletion
	// of acknowledged entries), and must call Lost any message it cannot
	// find while it cannot show that every consumer had it. A consumer
	// group the broker lost with its data (its consumer will create it
	// again) counts as having acknowledged nothing until it is back: a
	// message the groups still there have read is not Settled for it. It
	// may remove from the broker what it settles (Redis trims its
	// streams), but only what an earlier Check's committed state accounts
	// for: a removal whose verdict rolls back would make the next Check
	// take what it removed for lost.
	Check(ctx context.Context, brokerTopic string, prev []byte, held []Held, partial bool) (Verdict, error)
}

// Receipt is where a broker put a message it acknowledged.
type Receipt struct {
	// BrokerTopic is the stream, subject or topic the message went to.
	BrokerTopic string
	// Position locates the message there in the broker's own terms (a
	// Redis entry id, a JetStream stream sequence, a Kafka partition and
	// offset). It is opaque to the forwarder and must not be empty.
	Position string
}

// Held is a receipt not yet settled, handed to [Auditor.Check].
type Held struct {
	Position string
	// MessageID is the message's UUID (the outbox row's message_id), for a
	// broker whose positions can be reused (a JetStream sequence, a Kafka
	// offset after a truncation) to tell its message from another. Empty
	// when the outbox row is gone (retention purged it).
	MessageID string
}

// Status is [Auditor.Check]'s judgement of one held message.
type Status uint8

const (
	// Unsettled: the broker holds the message and some consumer may not
	// have acknowledged it yet (or no consumer reads the broker topic
	// yet). It is checked again at the next audit.
	Unsettled Status = iota
	// Settled: every consumer of the broker topic acknowledged the
	// message while the broker held it; whatever happens to it now loses
	// nothing. The receipt is forgotten.
	Settled
	// Lost: the broker no longer holds the message and cannot show that
	// every consumer had it. The forwarder publishes the row again (a
	// consumer that had it drops the duplicate) and forgets the receipt:
	// the new publish makes a new one.
	Lost
)

// Verdict is what [Auditor.Check] found on one broker topic.
type Verdict struct {
	// State is what the next Check of the broker topic gets as prev.
	State []byte
	// Status holds one Status per held message, in held's order.
	Status []Status
	// Reason says what showed the losses, for the log, the metrics and
	// outbox_audit (e.g. "stream missing", "entry 1700-3 missing above the
	// stream's first entry"); empty when nothing was Lost.
	Reason string
	// Again asks for a Check of the broker topic at the next audit even
	// with nothing held: this one left work for the next (Redis: a trim
	// it decided, applied once the verdict is committed).
	Again bool
}

// AwaitGroupsFor bounds how long [AwaitLostGroups] keeps a consumer group
// lost with the data awaited: a group retired during the incident must not
// hold the broker topic's messages unsettled for ever.
const AwaitGroupsFor = 24 * time.Hour

// AwaitLostGroups is the rule every built-in [Auditor] applies to consumer
// groups (consumers, in JetStream's words) that vanished: a group the
// broker lost with its data is created again by its consumer, which reads
// from the start, so until it is back it counts as having acknowledged
// nothing; a group gone while the data is intact was removed on purpose,
// and is forgotten.
//
// known are the groups the previous Check saw, awaited those it awaited,
// by when each was first missed (Unix ms); present says whether a group
// is there now; lost says the data went (the data set replaced, the broker
// topic missing or gone back, a message lost). It returns the groups to
// await now, for at most AwaitGroupsFor, nil when none.
func AwaitLostGroups(known []string, awaited map[string]int64, present func(group string) bool, lost bool, now time.Time) map[string]int64 {
	var out map[string]int64
	await := func(g string, since int64) {
		if now.UnixMilli()-since > AwaitGroupsFor.Milliseconds() {
			return
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[g] = since
	}
	for g, since := range awaited {
		if !present(g) {
			await(g, since)
		}
	}
	if lost {
		for _, g := range known {
			if _, already := out[g]; !already && !present(g) {
				await(g, now.UnixMilli())
			}
		}
	}
	return out
}
