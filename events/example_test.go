package events_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outflow-dev/outflow/events"
)

// A service defines its events as plain structs with an event type: here
// the invoice aggregate of a billing service.
const invoiceAggregate = "invoice"

// invoicePaid is published when an invoice is paid.
type invoicePaid struct {
	InvoiceID  string    `json:"invoice_id"`
	CustomerID string    `json:"customer_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	PaidAt     time.Time `json:"paid_at"`
}

// invoiceCanceled is published when an open invoice is canceled.
type invoiceCanceled struct {
	InvoiceID  string `json:"invoice_id"`
	CustomerID string `json:"customer_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

func (invoicePaid) EventType() string     { return "invoice.paid" }
func (invoiceCanceled) EventType() string { return "invoice.canceled" }

// Validate, when a payload has it, runs on every decode.
func (e invoicePaid) Validate() error {
	return checkInvoice(e.InvoiceID, e.CustomerID, e.Amount, e.Currency)
}

func (e invoiceCanceled) Validate() error {
	return checkInvoice(e.InvoiceID, e.CustomerID, e.Amount, e.Currency)
}

func checkInvoice(id, customer string, amount int64, currency string) error {
	switch {
	case id == "" || customer == "":
		return errors.New("invoice_id and customer_id are required")
	case amount <= 0:
		return errors.New("amount must be positive")
	case len(currency) != 3:
		return errors.New("currency must be a 3-letter code")
	}
	return nil
}

// A consumer decodes what a producer encoded, by event type, without
// knowing the Go type in advance.
func ExampleRegistry_DecodeMessage() {
	reg := events.NewRegistry()
	if err := reg.Register(invoicePaid{}, invoiceCanceled{}); err != nil {
		panic(err)
	}

	ctx := events.WithCorrelationID(context.Background(), "req-42")
	ev, err := events.New(ctx, events.Aggregate{Type: invoiceAggregate, ID: "inv_1", Version: 2},
		invoicePaid{InvoiceID: "inv_1", CustomerID: "cus_1", Amount: 1250, Currency: "EUR", PaidAt: time.Now()})
	if err != nil {
		panic(err)
	}
	msg, err := ev.Message(ctx) // what travels through the outbox and the broker
	if err != nil {
		panic(err)
	}

	got, err := reg.DecodeMessage(msg)
	if err != nil {
		panic(err)
	}
	paid := got.Payload.(invoicePaid)
	fmt.Println(got.EventType, got.AggregateID, got.AggregateVersion, got.CorrelationID, paid.Amount, paid.Currency)

	_, err = reg.Decode("invoice.exploded", []byte(`{}`))
	var unknown *events.UnknownTypeError
	fmt.Println(errors.As(err, &unknown), err)
	// Output:
	// invoice.paid inv_1 2 req-42 1250 EUR
	// true decode event: unknown event type "invoice.exploded"
}
