package events_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
)

// A consumer decodes what a producer encoded, by event type, without
// knowing the Go type in advance.
func ExampleRegistry_DecodeMessage() {
	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		panic(err)
	}

	ctx := events.WithCorrelationID(context.Background(), "req-42")
	ev, err := events.New(ctx, events.Aggregate{Type: paymentevents.AggregateType, ID: "pay_1", Version: 2},
		paymentevents.Paid{PaymentID: "pay_1", MerchantID: "mer_1", Amount: 1250, Currency: "EUR", PaidAt: time.Now()})
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
	paid := got.Payload.(paymentevents.Paid)
	fmt.Println(got.EventType, got.AggregateID, got.AggregateVersion, got.CorrelationID, paid.Amount, paid.Currency)

	_, err = reg.Decode("payment.exploded", []byte(`{}`))
	var unknown *events.UnknownTypeError
	fmt.Println(errors.As(err, &unknown), err)
	// Output:
	// payment.paid pay_1 2 req-42 1250 EUR
	// true decode event: unknown event type "payment.exploded"
}
