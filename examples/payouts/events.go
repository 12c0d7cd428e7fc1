package payouts

import (
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

// Sent is written when the bank accepted the transfer.
type Sent struct {
	PayoutID    string `json:"payout_id"`
	MerchantID  string `json:"merchant_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

// EventType implements events.Payload.
func (Sent) EventType() string { return SentType }

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
	if err := r.Register(Requested{}, Sent{}, Failed{}); err != nil {
		return nil, err
	}
	return r, nil
}
