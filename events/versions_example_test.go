package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/outflow-dev/outflow/events"
)

// refundIssued has changed shape twice since it was first written:
//
//	v1 {"refund_id":"r1","amount":1250}                            (EUR implied)
//	v2 {"refund_id":"r1","amount":1250,"currency":"EUR"}
//	v3 {"refund_id":"r1","amount":{"value":1250,"currency":"EUR"}}
//
// The Go type is the newest shape only; the older ones live on as JSON in
// the outbox's history and the broker's retention, and reach it through
// the upcasters.
type refundIssued struct {
	RefundID string `json:"refund_id"`
	Amount   money  `json:"amount"`
}

type money struct {
	Value    int64  `json:"value"`
	Currency string `json:"currency"`
}

func (refundIssued) EventType() string  { return "refund.issued" }
func (refundIssued) SchemaVersion() int { return 3 }

// refundUpcasters are the chain from version 1. Each one is a small
// function of raw JSON, tested on stored examples of its old shape.
var refundUpcasters = []events.Upcaster{
	{From: 1, Func: func(old json.RawMessage) (json.RawMessage, error) {
		// v1 was EUR only: the currency becomes explicit.
		var m map[string]json.RawMessage
		if err := json.Unmarshal(old, &m); err != nil {
			return nil, err
		}
		m["currency"] = json.RawMessage(`"EUR"`)
		return json.Marshal(m)
	}},
	{From: 2, Func: func(old json.RawMessage) (json.RawMessage, error) {
		// v3 moved amount and currency into one money object.
		var v2 struct {
			RefundID string `json:"refund_id"`
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		if err := json.Unmarshal(old, &v2); err != nil {
			return nil, err
		}
		return json.Marshal(refundIssued{RefundID: v2.RefundID, Amount: money{Value: v2.Amount, Currency: v2.Currency}})
	}},
}

// A consumer written against the newest version reads every stored one:
// the envelope's schema_version says which shape the payload has, and the
// registry upcasts it before decoding. A version newer than the registry
// knows is ErrUnknownVersion, which the consumer retries until it is
// deployed with the new type.
func ExampleRegistry_RegisterVersioned() {
	reg := events.NewRegistry()
	if err := reg.RegisterVersioned(refundIssued{}, refundUpcasters...); err != nil {
		panic(err)
	}
	for _, stored := range []struct {
		version int
		payload string
	}{
		{1, `{"refund_id":"r1","amount":1250}`},
		{2, `{"refund_id":"r2","amount":990,"currency":"USD"}`},
		{3, `{"refund_id":"r3","amount":{"value":500,"currency":"GBP"}}`},
	} {
		p, err := reg.DecodeVersion("refund.issued", stored.version, []byte(stored.payload))
		if err != nil {
			panic(err)
		}
		fmt.Printf("v%d: %+v\n", stored.version, p)
	}

	// What a producer of this build writes carries version 3.
	ev, err := events.New(context.Background(), events.Aggregate{Type: "refund", ID: "r4", Version: 1},
		refundIssued{RefundID: "r4", Amount: money{Value: 1, Currency: "EUR"}})
	if err != nil {
		panic(err)
	}
	msg, err := ev.Message(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(events.SchemaVersionKey, msg.Metadata.Get(events.SchemaVersionKey))

	// A producer deployed first writes version 4.
	msg.Metadata.Set(events.SchemaVersionKey, "4")
	_, err = reg.DecodeMessage(msg)
	fmt.Println(errors.Is(err, events.ErrUnknownVersion))
	// Output:
	// v1: {RefundID:r1 Amount:{Value:1250 Currency:EUR}}
	// v2: {RefundID:r2 Amount:{Value:990 Currency:USD}}
	// v3: {RefundID:r3 Amount:{Value:500 Currency:GBP}}
	// schema_version 3
	// true
}
