package webhooks

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Message is what an account's endpoints are sent: one per event (its id is
// the event's message id, the webhook-id every endpoint receives), test
// event or notice.
type Message struct {
	ID         string
	AccountID  string
	EventType  string
	OccurredAt time.Time
	// SchemaVersion is the payload's schema version as written (1 for a
	// payload written without one).
	SchemaVersion int
	// Payload is the event's JSON as written.
	Payload json.RawMessage
}

// Renderer turns a message into the body an endpoint made for apiVersion
// receives. It must be deterministic: a retry sends, and signs, the same
// bytes. An error is the message's own fault: the delivery fails without a
// request.
type Renderer func(ctx context.Context, m Message, apiVersion string) ([]byte, error)

// Body is the envelope [DefaultRenderer] writes.
type Body struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// DefaultRenderer sends every endpoint the payload as written, in the
// envelope {"type", "timestamp", "data"} (Standard Webhooks' suggested
// shape), whatever its api_version: a service whose payloads change shape
// supplies a Renderer that converts them for the versions its endpoints
// were made for.
func DefaultRenderer(_ context.Context, m Message, _ string) ([]byte, error) {
	b, err := json.Marshal(Body{Type: m.EventType, Timestamp: m.OccurredAt.UTC(), Data: m.Payload})
	if err != nil {
		return nil, fmt.Errorf("render webhook %s: %w", m.ID, err)
	}
	return b, nil
}

// Notice types the package sends on its own account.
const (
	// EventEndpointDisabled is sent to an account's other endpoints when
	// one is disabled for failing continuously; its data is
	// [EndpointDisabled].
	EventEndpointDisabled = "endpoint.disabled"
	// EventTest is a test event sent on request; its data is [TestEvent].
	EventTest = "webhook.test"
)

// EndpointDisabled is the data of an endpoint.disabled notice.
type EndpointDisabled struct {
	EndpointID   string    `json:"endpoint_id"`
	URL          string    `json:"url"`
	FailingSince time.Time `json:"failing_since"`
	DisabledAt   time.Time `json:"disabled_at"`
	LastError    string    `json:"last_error,omitempty"`
}

// TestEvent is the data of a test event.
type TestEvent struct {
	EndpointID string `json:"endpoint_id"`
	Message    string `json:"message"`
}
