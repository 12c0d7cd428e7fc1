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
}

// Message builds the broker message of an outbox row: the message id as
// its UUID, the row's metadata and envelope as metadata, the payload as it
// is. The forwarder publishes what it returns; so does a replay (package
// replay), so a replayed event is byte for byte the one first forwarded.
func Message(r Row) (*message.Message, error) {
	md := make(message.Metadata)
	if r.Metadata != "" && r.Metadata != "{}" {
		if err := json.Unmarshal([]byte(r.Metadata), &md); err != nil {
			return nil, fmt.Errorf("metadata is not a JSON object of strings: %w", err)
		}
	}
	env := events.Envelope{
		MessageID: r.MessageID, EventType: r.EventType, AggregateType: r.AggregateType,
		AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion, OccurredAt: r.OccurredAt,
	}
	for k, v := range env.Metadata() {
		md[k] = v
	}
	msg := message.NewMessage(r.MessageID, []byte(r.Payload))
	msg.Metadata = md
	return msg, nil
}
