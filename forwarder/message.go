package forwarder

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/events"
)

// Row is what [Message] reads of an outbox row: its columns as text, the
// way the claim selects them (payload::text, metadata::text).
type Row struct {
	MessageID        string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	EventType        string
	Payload          string
	Metadata         string
	OccurredAt       time.Time
	// DiscardedAt is set when an operator discarded the row
	// ([DiscardParked]): its message is then the discard marker.
	DiscardedAt *time.Time
}

// Message builds the broker message of an outbox row: the message id as
// its UUID, the row's metadata and envelope as metadata, the payload as it
// is. The forwarder publishes what it returns; so does a replay (package
// replay), so a replayed event is byte for byte the one first forwarded.
//
// A discarded row's message is the discard marker instead (see
// [events.EventTypeDiscarded]): the same message id, aggregate, version and
// occurred_at, event type [events.EventTypeDiscarded] with the row's own
// event type and the discard time in metadata, of the row's own metadata
// only its correlation id and traceparent (a row parked because its
// metadata made the message too large must not have a marker as large),
// and an empty JSON object as payload.
// A discarded row's metadata that is not a JSON object of strings is left
// out rather than failing the marker: the row may have been discarded for
// that very reason, and the marker must go out for its aggregate to flow.
func Message(r Row) (*message.Message, error) {
	md := make(message.Metadata)
	if r.Metadata != "" && r.Metadata != "{}" {
		if err := json.Unmarshal([]byte(r.Metadata), &md); err != nil {
			if r.DiscardedAt == nil {
				return nil, fmt.Errorf("metadata is not a JSON object of strings: %w", err)
			}
			md = make(message.Metadata)
		}
		if md == nil { // the JSON null: no metadata, and a nil map would panic below
			md = make(message.Metadata)
		}
	}
	env := events.Envelope{
		MessageID: r.MessageID, EventType: r.EventType, AggregateType: r.AggregateType,
		AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion, OccurredAt: r.OccurredAt,
	}
	payload := r.Payload
	if r.DiscardedAt != nil {
		env.EventType = events.EventTypeDiscarded
		payload = "{}"
		md = markerMetadata(md)
	}
	for k, v := range env.Metadata() {
		md[k] = v
	}
	if r.DiscardedAt != nil {
		md[events.DiscardedEventTypeKey] = r.EventType
		md[events.DiscardedAtKey] = r.DiscardedAt.UTC().Format(time.RFC3339Nano)
	}
	msg := message.NewMessage(r.MessageID, []byte(payload))
	msg.Metadata = md
	return msg, nil
}

// markerMetadata keeps, of a discarded row's metadata, what ties the marker
// to its cause and its trace.
func markerMetadata(md message.Metadata) message.Metadata {
	out := make(message.Metadata, 2)
	for _, k := range []string{events.CorrelationIDKey, events.TraceparentKey} {
		if v, ok := md[k]; ok {
			out[k] = v
		}
	}
	return out
}
