package fanout_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

func TestEnqueueMatchesFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, schema.Set())
	endpoint := func(account string, types []string, disabled bool, circuit *time.Time) string {
		id := uuid.NewString()
		var disabledAt *time.Time
		var reason *string
		if disabled {
			now, r := time.Now(), "manual"
			disabledAt, reason = &now, &r
		}
		if _, err := s.Pool.Exec(ctx, `INSERT INTO webhook_endpoints
			(id, account_id, url, event_types, secret, disabled_at, disabled_reason, circuit_open_until)
			VALUES ($1, $2, 'https://example.com/hook', $3, 'whsec_AAAA', $4, $5, $6)`,
			id, account, types, disabledAt, reason, circuit); err != nil {
			t.Fatal(err)
		}
		return id
	}
	later := time.Now().Add(time.Hour)
	all := endpoint("acct", []string{}, false, nil)
	exact := endpoint("acct", []string{"payment.paid"}, false, nil)
	prefix := endpoint("acct", []string{"refund.created", "payment.*"}, false, nil)
	other := endpoint("acct", []string{"refund.*"}, false, nil)
	off := endpoint("acct", []string{}, true, nil)
	open := endpoint("acct", []string{}, false, &later)
	endpoint("another", []string{}, false, nil)

	msg := webhooks.Message{ID: uuid.NewString(), AccountID: "acct", EventType: "payment.paid",
		OccurredAt: time.Now(), Payload: json.RawMessage(`{"amount":1}`)}
	r, err := fanout.Enqueue(ctx, s.Pool, msg, fanout.Target{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Recorded || r.Pending != 4 {
		t.Fatalf("Enqueue = %+v, want recorded with 4 pending (all, exact, prefix, open circuit)", r)
	}
	type row struct {
		status  string
		waiting bool
	}
	got := map[string]row{}
	rows, _ := s.Pool.Query(ctx, `SELECT endpoint_id::text, status, next_attempt_at > now() + interval '30 minutes'
		FROM webhook_endpoint_deliveries WHERE message_id = $1`, msg.ID)
	for rows.Next() {
		var id string
		var x row
		if err := rows.Scan(&id, &x.status, &x.waiting); err != nil {
			t.Fatal(err)
		}
		got[id] = x
	}
	want := map[string]row{all: {"pending", false}, exact: {"pending", false}, prefix: {"pending", false},
		off: {"failed", false}, open: {"pending", true}}
	if len(got) != len(want) {
		t.Fatalf("deliveries %v, want %v (not %s)", got, want, other)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("endpoint %s: %+v, want %+v", id, got[id], w)
		}
	}

	// The same event again (a redelivery) records nothing more.
	if r, err := fanout.Enqueue(ctx, s.Pool, msg, fanout.Target{}, ""); err != nil || r.Recorded || r.Pending != 0 {
		t.Fatalf("second Enqueue = %+v, %v; want nothing recorded", r, err)
	}
	// A type no endpoint wants stores no message at all.
	none := webhooks.Message{ID: uuid.NewString(), AccountID: "another-acct", EventType: "payment.paid", OccurredAt: time.Now()}
	if r, err := fanout.Enqueue(ctx, s.Pool, none, fanout.Target{}, ""); err != nil || r.Recorded {
		t.Fatalf("Enqueue without endpoints = %+v, %v", r, err)
	}
	var n int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_messages WHERE id = $1`, none.ID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d messages stored for an event nobody wants (%v)", n, err)
	}
	// A notice: every other endpoint, filters ignored.
	notice := webhooks.Message{ID: uuid.NewString(), AccountID: "acct", EventType: webhooks.EventEndpointDisabled, OccurredAt: time.Now()}
	if r, err := fanout.Enqueue(ctx, s.Pool, notice, fanout.Target{Except: all, AllTypes: true}, ""); err != nil || r.Pending != 4 {
		t.Fatalf("notice Enqueue = %+v, %v; want 4 pending (exact, prefix, other, open)", r, err)
	}
}
