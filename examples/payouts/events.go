package payouts

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/outflow-dev/outflow/events"
)

// AggregateType is the aggregate type of every payout event; it is also
// the topic they are routed to.
const AggregateType = "payout"

// Event types.
const (
	RequestedType = "payout.requested"
	SentType      = "payout.sent"
	FailedType    = "payout.failed"
)

// Requested is written when a merchant asks for a payout.
type Requested struct {
	PayoutID    string `json:"payout_id"`
	MerchantID  string `json:"merchant_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

// EventType implements events.Payload.
func (Requested) EventType() string { return RequestedType }

// Validate rejects a payload no producer of ours writes.
func (r Requested) Validate() error {
	switch {
	case r.PayoutID == "" || r.MerchantID == "":
		return errors.New("payout_id and merchant_id are required")
	case r.AmountMinor <= 0:
		return fmt.Errorf("amount_minor must be positive, got %d", r.AmountMinor)
	}
	return nil
}

// Sent is written when the bank accepted the transfer. Its amount is one
// money object since version 2; version 1 had amount_minor and currency
// side by side, and its events stay in the outbox's history.
type Sent struct {
	PayoutID   string `json:"payout_id"`
	MerchantID string `json:"merchant_id"`
	Amount     Money  `json:"amount"`
}

// Money is an amount in a currency's minor units.
type Money struct {
	Minor    int64  `json:"minor"`
	Currency string `json:"currency"`
}

// EventType implements events.Payload.
func (Sent) EventType() string { return SentType }

// SchemaVersion implements events.Versioned: the shape's version 2.
func (Sent) SchemaVersion() int { return 2 }

// sentFromV1 is the upcaster of a stored version 1 payout.sent,
// {"amount_minor":1250,"currency":"EUR",...}, to version 2,
// {"amount":{"minor":1250,"currency":"EUR"},...}. It works on the JSON:
// the Go type has no version 1 any more.
func sentFromV1(old json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(old, &m); err != nil {
		return nil, err
	}
	amount, err := json.Marshal(map[string]json.RawMessage{"minor": m["amount_minor"], "currency": m["currency"]})
	if err != nil {
		return nil, err
	}
	delete(m, "amount_minor")
	delete(m, "currency")
	m["amount"] = amount
	return json.Marshal(m)
}

// Failed is written when the transfer was refused; the amount is the
// merchant's to pay out again.
type Failed struct {
	PayoutID    string `json:"payout_id"`
	MerchantID  string `json:"merchant_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	Reason      string `json:"reason"`
}

// EventType implements events.Payload.
func (Failed) EventType() string { return FailedType }

// Registry returns a registry of the payout events, for the consumers.
func Registry() (*events.Registry, error) {
	r := events.NewRegistry()
	if err := r.RegisterVersioned(Sent{}, events.Upcaster{From: 1, Func: sentFromV1}); err != nil {
		return nil, err
	}
	if err := r.Register(Requested{}, Sent{}, Failed{}); err != nil {
		return nil, err
	}
	return r, nil
}
