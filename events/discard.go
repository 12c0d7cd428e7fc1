package events

import "github.com/ThreeDotsLabs/watermill/message"

// The discard marker: what the forwarder publishes in place of an outbox
// row an operator discarded (`outflow outbox discard`). It keeps the
// event's message id, aggregate and version, so that the aggregate's stream
// has no hole: a consumer applying versions in order applies the marker and
// goes on with the next version, where a missing version would hold every
// later one and end in a dead letter. Its payload is the empty object.
//
// It has an event type of its own, rather than the discarded event's with an
// empty payload, so that a consumer outside Outflow that ignores event types
// it does not know (the usual habit) skips it, instead of decoding a
// zero-valued event. Consumers built on package idempotency never see it:
// the middleware records it processed without calling their handler.
const (
	// EventTypeDiscarded is the marker's event type.
	EventTypeDiscarded = "outflow.discarded"
	// DiscardedEventTypeKey is the metadata key of the discarded event's
	// own event type.
	DiscardedEventTypeKey = "outflow_discarded_event_type"
	// DiscardedAtKey is the metadata key of when the operator discarded it,
	// RFC 3339 with nanoseconds, UTC.
	DiscardedAtKey = "outflow_discarded_at"
)

// IsDiscardMarker reports whether msg is a discard marker.
func IsDiscardMarker(msg *message.Message) bool {
	return msg.Metadata.Get(EventTypeKey) == EventTypeDiscarded
}
