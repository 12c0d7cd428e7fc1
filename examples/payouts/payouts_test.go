package payouts_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/examples/payouts"
	"github.com/outflow-dev/outflow/outflowtest"
)

func newService(t *testing.T) (*payouts.Service, *outflowtest.Schema) {
	t.Helper()
	s := outflowtest.NewSchema(t, payouts.Migrations())
	w, err := outbox.NewWriter(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return payouts.NewService(s.Pool, w, nil), s
}

func count(t *testing.T, s *outflowtest.Schema, sql string) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A bad request gets a 400 naming the field, and writes neither a payout nor
// an event.
func TestBadRequestNamesTheFieldAndWritesNothing(t *testing.T) {
	svc, s := newService(t)
	srv := httptest.NewServer(svc.Handler(nil))
	defer srv.Close()
	for _, tc := range []struct{ body, field string }{
		{`{"merchant_id": "", "amount_minor": 100, "currency": "EUR"}`, "merchant_id"},
		{`{"merchant_id": "m1", "amount_minor": 0, "currency": "EUR"}`, "amount_minor"},
		{`{"merchant_id": "m1", "amount_minor": "100", "currency": "EUR"}`, "amount_minor"},
		{`{"merchant_id": "m1", "amount_minor": 100, "currency": "euro"}`, "currency"},
		{`{"merchant_id": "m1", "amount_minor": 100, "currency": "EUR", "extra": 1}`, "body"},
	} {
		resp, err := http.Post(srv.URL+"/payouts", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error, Field string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || body.Field != tc.field {
			t.Errorf("%s: got %d %+v, want 400 naming %q", tc.body, resp.StatusCode, body, tc.field)
		}
	}
	if n := count(t, s, `SELECT count(*) FROM payouts`) + count(t, s, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("bad requests wrote %d rows", n)
	}
}

// A payout that cannot change (sent twice) gets a 409 and writes no second
// event.
func TestSentTwiceIsAConflict(t *testing.T) {
	svc, s := newService(t)
	ctx := t.Context()
	p, err := svc.Request(ctx, "m1", 500, "eur")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.MarkSent(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler(nil))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/payouts/"+p.ID+"/failed", "application/json", strings.NewReader(`{"reason": "late"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("got %d, want 409", resp.StatusCode)
	}
	if n := count(t, s, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("outbox holds %d events, want 2 (requested, sent)", n)
	}
}

// database/sql through lib/pq writes the payout and its event in one
// transaction.
func TestRequestStdWritesBoth(t *testing.T) {
	_, s := newService(t)
	w, err := outbox.NewWriter(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	db := s.OpenLibPQ(t)
	if _, err := payouts.RequestStd(t.Context(), db, w, "m1", 700, "EUR"); err != nil {
		t.Fatal(err)
	}
	if p, o := count(t, s, `SELECT count(*) FROM payouts`), count(t, s, `SELECT count(*) FROM outbox WHERE event_type = 'payout.requested'`); p != 1 || o != 1 {
		t.Fatalf("payouts %d, events %d; want 1 and 1", p, o)
	}
}
