package payouts_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/examples/payouts"
	"github.com/outflow-dev/outflow/outflowtest"
)

func registry(t *testing.T) *events.Registry {
	t.Helper()
	reg, err := payouts.Registry()
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// balances reads the projection the Balances consumer keeps.
func balances(t *testing.T, s *outflowtest.Schema, merchant string) func(context.Context) any {
	return func(ctx context.Context) any {
		rows, err := s.Pool.Query(ctx, `SELECT currency, in_flight_minor, paid_out_minor FROM payout_balances
			WHERE merchant_id = $1 ORDER BY currency`, merchant)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out [][3]any
		for rows.Next() {
			var cur string
			var inFlight, paid int64
			if err := rows.Scan(&cur, &inFlight, &paid); err != nil {
				t.Fatal(err)
			}
			out = append(out, [3]any{cur, inFlight, paid})
		}
		return out
	}
}

// Each command writes its event, with the payout's version, in its own
// transaction.
func TestCommandsWriteTheirEvents(t *testing.T) {
	svc, s := newService(t)
	ctx := t.Context()
	p, err := svc.Request(ctx, "m1", 1250, "eur")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.MarkSent(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	outflowtest.RequireEvents(ctx, t, s.Pool,
		outflowtest.Want{Type: payouts.RequestedType, AggregateType: payouts.AggregateType, AggregateID: p.ID, Version: 1,
			Topic: "payout", Payload: map[string]any{"merchant_id": "m1", "amount_minor": 1250, "currency": "EUR"}},
		outflowtest.Want{Type: payouts.SentType, AggregateID: p.ID, Version: 2},
	)
}

// The consumer applies a payout's events in order whatever order they come
// in, and a redelivery changes nothing.
func TestBalancesOutOfOrderAndDuplicate(t *testing.T) {
	_, s := newService(t)
	ctx := t.Context()
	h := outflowtest.NewHandlerHarness(t, s.Pool, registry(t), payouts.Balances())
	agg := func(v int64) events.Aggregate {
		return events.Aggregate{Type: payouts.AggregateType, ID: "00000000-0000-0000-0000-000000000001", Version: v}
	}
	requested, err := events.New(ctx, agg(1), payouts.Requested{PayoutID: "p1", MerchantID: "m1", AmountMinor: 900, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	sent, err := events.New(ctx, agg(2), payouts.Sent{PayoutID: "p1", MerchantID: "m1", Amount: payouts.Money{Minor: 900, Currency: "EUR"}})
	if err != nil {
		t.Fatal(err)
	}
	if d := h.Deliver(ctx, sent); d.Outcome != outflowtest.Held {
		t.Fatalf("sent before requested: %s, want held", d.Outcome)
	}
	if d := h.Deliver(ctx, requested); d.Outcome != outflowtest.Applied || len(d.Released) != 1 {
		t.Fatalf("requested: %s, released %v; want applied, releasing sent", d.Outcome, d.Released)
	}
	want := [][3]any{{"EUR", int64(0), int64(900)}}
	if got := balances(t, s, "m1")(ctx); !equal(got, want) {
		t.Fatalf("balances %v, want %v", got, want)
	}
	if d := h.Redeliver(ctx, requested); d.Outcome != outflowtest.Duplicate {
		t.Fatalf("redelivered: %s, want duplicate", d.Outcome)
	}
	if got := balances(t, s, "m1")(ctx); !equal(got, want) {
		t.Fatalf("after a redelivery: balances %v, want %v", got, want)
	}
}

// A crash after the handler's writes leaves none of them; the retry applies
// them once.
func TestBalancesSurviveACrashInTheHandler(t *testing.T) {
	_, s := newService(t)
	ctx := t.Context()
	h := outflowtest.NewHandlerHarness(t, s.Pool, registry(t), payouts.Balances())
	ev, err := events.New(ctx, events.Aggregate{Type: payouts.AggregateType, ID: "00000000-0000-0000-0000-000000000002", Version: 1},
		payouts.Requested{PayoutID: "p2", MerchantID: "m2", AmountMinor: 300, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	got := h.RequireIdempotent(ctx, ev, balances(t, s, "m2"))
	if want := [][3]any{{"USD", int64(300), int64(0)}}; !equal(got, want) {
		t.Fatalf("balances %v, want %v", got, want)
	}
}

// The whole service in-process (forwarder and worker, no external broker),
// through a forwarder crash after publish and a handler crash: every
// payout's effect lands exactly once.
func TestPipelineExactlyOnceThroughCrashes(t *testing.T) {
	svc, s := newService(t)
	ctx := t.Context()
	p := outflowtest.StartPipeline(t, s.Pool, registry(t), []consumer.Handler{payouts.Balances()})
	p.CrashAfterPublish(1)
	p.CrashInHandler(payouts.BalancesName, 2)
	var ids []string
	for range 10 {
		po, err := svc.Request(ctx, "m3", 100, "EUR")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, po.ID)
	}
	for _, id := range ids[:4] {
		if _, err := svc.MarkSent(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	p.WaitHandled()
	if p.PendingCrashes() != 0 {
		t.Fatalf("%d injected crashes did not fire", p.PendingCrashes())
	}
	if got, want := balances(t, s, "m3")(ctx), [][3]any{{"EUR", int64(600), int64(400)}}; !equal(got, want) {
		t.Fatalf("balances %v, want %v", got, want)
	}
}

func equal(got any, want [][3]any) bool { return reflect.DeepEqual(got, want) }
