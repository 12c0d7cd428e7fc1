package payouts_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/examples/payouts"
	"github.com/outflow-dev/outflow/outflowtest"
)

// sentV1 is payout.sent as version 1 of the service wrote it, amount_minor
// and currency side by side: what the outbox's history and the broker's
// retention still hold after version 2 is deployed.
type sentV1 struct {
	PayoutID    string `json:"payout_id"`
	MerchantID  string `json:"merchant_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

func (sentV1) EventType() string { return payouts.SentType }

// A payout.sent the previous build wrote (version 1), still in the outbox
// when this build (version 2) deploys, reaches this build's consumer as a
// version 2 Sent, through the upcaster; a replay of the row decodes it the
// same way.
func TestStoredVersion1SentIsReadAsVersion2(t *testing.T) {
	svc, s := newService(t)
	ctx := t.Context()
	p, err := svc.Request(ctx, "m4", 700, "EUR")
	if err != nil {
		t.Fatal(err)
	}
	// The previous build's MarkSent: the payout sent, a version 1 event.
	old, err := outbox.NewWriter(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE payouts SET status = 'sent', version = 2 WHERE id = $1`, p.ID); err != nil {
			return err
		}
		return old.WriteTx(ctx, tx, events.Aggregate{Type: payouts.AggregateType, ID: p.ID, Version: 2},
			sentV1{PayoutID: p.ID, MerchantID: "m4", AmountMinor: 700, Currency: "EUR"})
	})
	if err != nil {
		t.Fatal(err)
	}
	stored := outflowtest.RequireEvent(ctx, t, s.Pool, outflowtest.Want{Type: payouts.SentType, AggregateID: p.ID, Version: 2,
		Payload: map[string]any{"amount_minor": 700, "currency": "EUR"}})
	// Version 1 is written without the key, and read as 1.
	if v, ok := stored.Message(ctx).Metadata[events.SchemaVersionKey]; ok {
		t.Fatalf("the stored event has schema_version %q, want none (version 1)", v)
	}

	// A replay decodes the row with this build's registry: version 2.
	ev, err := stored.Event(registry(t))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ev.Payload, (payouts.Sent{PayoutID: p.ID, MerchantID: "m4",
		Amount: payouts.Money{Minor: 700, Currency: "EUR"}}); got != want {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}

	// And this build's consumer applies it, after the payout's Requested.
	pl := outflowtest.StartPipeline(t, s.Pool, registry(t), []consumer.Handler{payouts.Balances()})
	pl.WaitHandled()
	if got, want := balances(t, s, "m4")(ctx), [][3]any{{"EUR", int64(0), int64(700)}}; !equal(got, want) {
		t.Fatalf("balances %v, want %v", got, want)
	}
}
