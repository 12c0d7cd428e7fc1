// Package paymentevents holds the events of the payment aggregate: the contract
// between the payments service that writes them and every consumer.
//
// Payloads carry everything a consumer needs to act (amounts in minor units,
// currency, merchant, timestamps), so consumers never read the producer's
// database. Fields may be added; none is ever renamed or given a new meaning.
package paymentevents

import (
	"errors"
	"time"

	"github.com/outflow-dev/outflow/events"
)

// AggregateType is the aggregate type of every payment event.
const AggregateType = "payment"

// Event types.
const (
	CreatedType  = "payment.created"
	PaidType     = "payment.paid"
	RefundedType = "payment.refunded"
	CanceledType = "payment.canceled"
)

// Created is published when a payment is created, in status pending.
type Created struct {
	PaymentID  string    `json:"payment_id"`
	MerchantID string    `json:"merchant_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	Status     string    `json:"status"`
	CreatedAt  time.Time `json:"created_at"`
}

// Paid is published when a pending payment is paid.
type Paid struct {
	PaymentID  string    `json:"payment_id"`
	MerchantID string    `json:"merchant_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	PaidAt     time.Time `json:"paid_at"`
}

// Refunded is published for every refund, partial or full. Amount is this
// refund; RefundedAmount is the total refunded so far, including it.
type Refunded struct {
	PaymentID      string    `json:"payment_id"`
	MerchantID     string    `json:"merchant_id"`
	Amount         int64     `json:"amount"`
	RefundedAmount int64     `json:"refunded_amount"`
	PaymentAmount  int64     `json:"payment_amount"`
	Currency       string    `json:"currency"`
	Status         string    `json:"status"`
	RefundedAt     time.Time `json:"refunded_at"`
}

// Canceled is published when a pending payment is canceled.
type Canceled struct {
	PaymentID  string    `json:"payment_id"`
	MerchantID string    `json:"merchant_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	CanceledAt time.Time `json:"canceled_at"`
}

func (Created) EventType() string  { return CreatedType }
func (Paid) EventType() string     { return PaidType }
func (Refunded) EventType() string { return RefundedType }
func (Canceled) EventType() string { return CanceledType }

var (
	errNoPaymentID  = errors.New("payment_id is empty")
	errNoMerchantID = errors.New("merchant_id is empty")
	errAmount       = errors.New("amount must be positive")
	errCurrency     = errors.New("currency must be a 3-letter code")
)

func check(paymentID, merchantID string, amount int64, currency string) error {
	switch {
	case paymentID == "":
		return errNoPaymentID
	case merchantID == "":
		return errNoMerchantID
	case amount <= 0:
		return errAmount
	case len(currency) != 3:
		return errCurrency
	}
	return nil
}

func (e Created) Validate() error  { return check(e.PaymentID, e.MerchantID, e.Amount, e.Currency) }
func (e Paid) Validate() error     { return check(e.PaymentID, e.MerchantID, e.Amount, e.Currency) }
func (e Canceled) Validate() error { return check(e.PaymentID, e.MerchantID, e.Amount, e.Currency) }

func (e Refunded) Validate() error {
	if err := check(e.PaymentID, e.MerchantID, e.Amount, e.Currency); err != nil {
		return err
	}
	if e.RefundedAmount < e.Amount || e.RefundedAmount > e.PaymentAmount {
		return errors.New("refunded_amount must lie between amount and payment_amount")
	}
	return nil
}

// SchemaSnapshot is the committed snapshot of the payment events' schemas
// (package events/schemacheck), relative to this package's directory; from
// the repository's root it is app/paymentevents/event-schemas.json, what
// `outflow events check` reads by default.
const SchemaSnapshot = "event-schemas.json"

// Register adds every payment event type to r.
func Register(r *events.Registry) error {
	return r.Register(Created{}, Paid{}, Refunded{}, Canceled{})
}
