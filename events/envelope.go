package events

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
)

// Metadata keys under which the envelope travels in a Watermill message.
// CorrelationIDKey is Watermill's own key, so its CorrelationID middleware
// keeps working.
const (
	MessageIDKey        = "message_id"
	EventTypeKey        = "event_type"
	AggregateTypeKey    = "aggregate_type"
	AggregateIDKey      = "aggregate_id"
	AggregateVersionKey = "aggregate_version"
	OccurredAtKey       = "occurred_at"
	CorrelationIDKey    = "correlation_id"
	TraceparentKey      = "traceparent"
)

// Envelope is what every event carries besides its payload.
type Envelope struct {
	// MessageID is a UUIDv7, unique per event. It is the Watermill message
	// UUID and the deduplication key of every consumer.
	MessageID string
	// EventType names the payload's type, e.g. "payment.paid".
	EventType string
	// AggregateType and AggregateID name the entity whose state changed.
	AggregateType string
	AggregateID   string
	// AggregateVersion is the aggregate's version after the change: 1 for the
	// event that created it, then 2, 3, ... without gaps.
	AggregateVersion int64
	// OccurredAt is when the change happened, in UTC.
	OccurredAt time.Time
	// CorrelationID ties the event to the request or message that caused it.
	CorrelationID string
	// Traceparent is the W3C trace context of the causing request, if any.
	Traceparent string
	// SchemaVersion is the version of the payload's JSON shape as written
	// (see [Versioned]); 0 means unset. events.New and Event.Message set it
	// from the payload; [Envelope.Metadata] writes version 2 or more, and
	// EnvelopeFromMessage reads a message without it as version 1. After [Registry.DecodeMessage] it
	// still says what was written: the decoded Payload is always the
	// registered type's version, older payloads upcast to it.
	SchemaVersion int
}

// Validate reports the first missing or invalid field of the envelope.
func (e Envelope) Validate() error {
	switch {
	case e.MessageID == "":
		return &EnvelopeError{Field: MessageIDKey, Reason: "missing"}
	case e.EventType == "":
		return &EnvelopeError{Field: EventTypeKey, Reason: "missing"}
	case e.AggregateType == "":
		return &EnvelopeError{Field: AggregateTypeKey, Reason: "missing"}
	case e.AggregateID == "":
		return &EnvelopeError{Field: AggregateIDKey, Reason: "missing"}
	case e.AggregateVersion < 1:
		return &EnvelopeError{Field: AggregateVersionKey, Reason: "must be 1 or more"}
	case e.OccurredAt.IsZero():
		return &EnvelopeError{Field: OccurredAtKey, Reason: "missing"}
	case e.Traceparent != "" && !traceparentRE.MatchString(e.Traceparent):
		return &EnvelopeError{Field: TraceparentKey, Reason: "not a W3C traceparent"}
	case e.SchemaVersion < 0:
		return &EnvelopeError{Field: SchemaVersionKey, Reason: "must be 1 or more"}
	}
	if _, err := uuid.Parse(e.MessageID); err != nil {
		return &EnvelopeError{Field: MessageIDKey, Reason: "not a UUID"}
	}
	return nil
}

// Metadata returns the envelope as Watermill message metadata.
func (e Envelope) Metadata() message.Metadata {
	md := message.Metadata{
		MessageIDKey:        e.MessageID,
		EventTypeKey:        e.EventType,
		AggregateTypeKey:    e.AggregateType,
		AggregateIDKey:      e.AggregateID,
		AggregateVersionKey: strconv.FormatInt(e.AggregateVersion, 10),
		OccurredAtKey:       e.OccurredAt.UTC().Format(time.RFC3339Nano),
	}
	if e.CorrelationID != "" {
		md[CorrelationIDKey] = e.CorrelationID
	}
	if e.Traceparent != "" {
		md[TraceparentKey] = e.Traceparent
	}
	// Only from version 2: a message without the key is version 1 (see
	// [SchemaVersionKey]). And only when set: the forwarder builds the
	// envelope of a row from its columns, where the version is not, and
	// must not overwrite the one the row's metadata carries.
	if e.SchemaVersion > 1 {
		md[SchemaVersionKey] = strconv.Itoa(e.SchemaVersion)
	}
	return md
}

// EnvelopeFromMessage reads the envelope back from a Watermill message. The
// message UUID wins over a message_id in metadata: it is what brokers and
// Watermill itself keep.
func EnvelopeFromMessage(msg *message.Message) (Envelope, error) {
	md := msg.Metadata
	env := Envelope{
		MessageID:     msg.UUID,
		EventType:     md.Get(EventTypeKey),
		AggregateType: md.Get(AggregateTypeKey),
		AggregateID:   md.Get(AggregateIDKey),
		CorrelationID: md.Get(CorrelationIDKey),
		Traceparent:   md.Get(TraceparentKey),
	}
	if env.MessageID == "" {
		env.MessageID = md.Get(MessageIDKey)
	}
	if v := md.Get(AggregateVersionKey); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Envelope{}, &EnvelopeError{Field: AggregateVersionKey, Reason: fmt.Sprintf("not an integer: %q", v)}
		}
		env.AggregateVersion = n
	}
	// A version that is not one is left 0 here and reported by
	// DecodeMessage: an envelope error would make the idempotency
	// middleware drop the message, where a decode error parks it for an
	// operator.
	if v, err := messageSchemaVersion(env.EventType, md); err == nil {
		env.SchemaVersion = v
	}
	if v := md.Get(OccurredAtKey); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return Envelope{}, &EnvelopeError{Field: OccurredAtKey, Reason: fmt.Sprintf("not an RFC 3339 time: %q", v)}
		}
		env.OccurredAt = t.UTC()
	}
	if err := env.Validate(); err != nil {
		return Envelope{}, err
	}
	return env, nil
}

// Payload is the typed body of an event. EventType must be a constant of the
// type: the registry calls it on the zero value.
type Payload interface {
	EventType() string
}

// Event is a payload in its envelope, ready to be published.
type Event struct {
	Envelope
	Payload Payload
}

// Aggregate names the entity an event belongs to and its version after the
// change: what events.New and outbox.Writer.WriteTx take, and what
// [Envelope.Aggregate] returns. Its fields are the envelope's
// AggregateType, AggregateID and AggregateVersion.
type Aggregate struct {
	Type    string
	ID      string
	Version int64
}

// Aggregate returns the aggregate the event belongs to, at the event's
// version: the write side's [Aggregate], with its field names.
func (e Envelope) Aggregate() Aggregate {
	return Aggregate{Type: e.AggregateType, ID: e.AggregateID, Version: e.AggregateVersion}
}

// New builds an event for a change of agg. It assigns a fresh UUIDv7, stamps
// the time, and copies the correlation id and traceparent from ctx (see
// [WithCorrelationID] and [WithTraceparent]).
func New(ctx context.Context, agg Aggregate, p Payload) (Event, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Event{}, fmt.Errorf("new message id: %w", err)
	}
	ev := Event{
		Envelope: Envelope{
			MessageID:        id.String(),
			EventType:        p.EventType(),
			AggregateType:    agg.Type,
			AggregateID:      agg.ID,
			AggregateVersion: agg.Version,
			OccurredAt:       time.Now().UTC(),
			CorrelationID:    CorrelationID(ctx),
			Traceparent:      Traceparent(ctx),
			SchemaVersion:    SchemaVersionOf(p),
		},
		Payload: p,
	}
	if err := ev.Validate(); err != nil {
		return Event{}, err
	}
	return ev, nil
}

// Message encodes the event as a Watermill message carrying ctx.
func (e Event) Message(ctx context.Context) (*message.Message, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	if e.Payload == nil {
		return nil, &EnvelopeError{Field: "payload", Reason: "missing"}
	}
	if got := e.Payload.EventType(); got != e.EventType {
		return nil, &EnvelopeError{Field: EventTypeKey, Reason: fmt.Sprintf("%q does not match the payload's type %q", e.EventType, got)}
	}
	// Every message carries its payload's version, also for an Event built
	// by hand without one.
	switch v := SchemaVersionOf(e.Payload); {
	case v < 1:
		return nil, &EnvelopeError{Field: SchemaVersionKey, Reason: fmt.Sprintf("%T declares version %d, must be 1 or more", e.Payload, v)}
	case e.SchemaVersion == 0:
		e.SchemaVersion = v
	case e.SchemaVersion != v:
		return nil, &EnvelopeError{Field: SchemaVersionKey, Reason: fmt.Sprintf("%d does not match the payload's version %d", e.SchemaVersion, v)}
	}
	body, err := json.Marshal(e.Payload)
	if err != nil {
		return nil, fmt.Errorf("encode %s payload: %w", e.EventType, err)
	}
	msg := message.NewMessage(e.MessageID, body)
	msg.Metadata = e.Metadata()
	msg.SetContext(ctx)
	return msg, nil
}

var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// ValidTraceparent reports whether s has the W3C traceparent form.
func ValidTraceparent(s string) bool { return traceparentRE.MatchString(s) }
