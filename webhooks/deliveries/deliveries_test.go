package deliveries_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

// fixture is a schema with the tables and helpers to fill them with plain
// SQL (the endpoints package is not this one's to use).
type fixture struct {
	t    *testing.T
	pool *pgxpool.Pool
	ctx  context.Context
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return &fixture{t: t, pool: outflowtest.NewSchema(t, schema.Set()).Pool, ctx: context.Background()}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

// endpoint inserts an endpoint of account with the event-type filter
// types (none: every type).
func (f *fixture) endpoint(account string, types ...string) string {
	f.t.Helper()
	id := uuid.NewString()
	if types == nil {
		types = []string{}
	}
	f.exec(`INSERT INTO webhook_endpoints (id, account_id, url, event_types, secret)
		VALUES ($1, $2, 'https://example.com/hook', $3, 'whsec_AAAA')`, id, account, types)
	return id
}

func (f *fixture) disable(endpoint string) {
	f.t.Helper()
	f.exec(`UPDATE webhook_endpoints SET disabled_at = now(), disabled_reason = 'failing' WHERE id = $1`, endpoint)
}

// message records a message of account through fanout.Enqueue, as the
// consumer handler does: a delivery per endpoint that wants it.
func (f *fixture) message(account, eventType string) string {
	f.t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	r, err := fanout.Enqueue(f.ctx, f.pool, webhooks.Message{ID: id, AccountID: account, EventType: eventType,
		OccurredAt: time.Now(), Payload: json.RawMessage(`{"n":1}`)}, fanout.Target{}, "")
	if err != nil || !r.Recorded {
		f.t.Fatalf("enqueue: %+v %v", r, err)
	}
	return id
}

// set puts the delivery of message to endpoint in a state: status,
// attempts, created that long ago.
func (f *fixture) set(message, endpoint, status string, attempts int, age time.Duration) int64 {
	f.t.Helper()
	var id int64
	if err := f.pool.QueryRow(f.ctx, `UPDATE webhook_endpoint_deliveries SET status = $3, attempts = $4,
		created_at = now() - make_interval(secs => $5),
		settled_at = CASE WHEN $3 <> 'pending' THEN now() END,
		last_error = CASE WHEN $3 = 'failed' THEN 'HTTP 500' END,
		next_attempt_at = CASE WHEN $3 = 'pending' THEN now() + interval '1 minute' ELSE now() END
		WHERE message_id = $1 AND endpoint_id = $2 RETURNING id`,
		message, endpoint, status, attempts, age.Seconds()).Scan(&id); err != nil {
		f.t.Fatalf("set delivery: %v", err)
	}
	return id
}

// lease leases the delivery as a sender does, for d (negative: lapsed).
func (f *fixture) lease(message, endpoint string, d time.Duration) {
	f.t.Helper()
	f.exec(`UPDATE webhook_endpoint_deliveries SET status = 'pending', lease_token = gen_random_uuid(),
		next_attempt_at = now() + make_interval(secs => $3) WHERE message_id = $1 AND endpoint_id = $2`,
		message, endpoint, d.Seconds())
}

type state struct {
	Status   string
	Attempts int
	Leased   bool
	Due      bool // next attempt within a few seconds from now
	Error    bool
	Settled  bool
}

func (f *fixture) state(message, endpoint string) state {
	f.t.Helper()
	var s state
	if err := f.pool.QueryRow(f.ctx, `SELECT status, attempts, lease_token IS NOT NULL,
		next_attempt_at BETWEEN now() - interval '5 seconds' AND now() + interval '5 seconds',
		last_error IS NOT NULL, settled_at IS NOT NULL
		FROM webhook_endpoint_deliveries WHERE message_id = $1 AND endpoint_id = $2`, message, endpoint).Scan(
		&s.Status, &s.Attempts, &s.Leased, &s.Due, &s.Error, &s.Settled); err != nil {
		f.t.Fatalf("read delivery: %v", err)
	}
	return s
}

func isValidation(err error, field string) bool {
	var v *webhooks.ValidationError
	return errors.As(err, &v) && v.Field == field
}

func ids(ds []deliveries.Delivery) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// List: newest first, filters, pages that follow their cursor to the
// end, one endpoint of one account only.
func TestList(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep := f.endpoint("acct")
	other := f.endpoint("acct")
	foreign := f.endpoint("another")

	// Created an hour, minutes, seconds ago: the creation time orders,
	// not the id (this one made last is the oldest).
	type made struct {
		msg string
		id  int64
	}
	var all []made // newest first
	for i, spec := range []struct {
		typ    string
		status string
		age    time.Duration
	}{
		{"payment.paid", "pending", time.Second},
		{"payment.paid", "failed", time.Minute},
		{"payment.refunded", "delivered", time.Minute}, // same time as the one before: by id
		{"payment.paid", "delivered", 2 * time.Minute},
		{"payment.refunded", "failed", 3 * time.Minute},
		{"payment.paid", "pending", 4 * time.Minute},
		{"payment.paid", "delivered", time.Hour},
	} {
		m := f.message("acct", spec.typ)
		id := f.set(m, ep, spec.status, i, spec.age)
		f.set(m, other, "delivered", 1, spec.age)
		all = append(all, made{m, id})
	}
	// Same age: the later id first.
	f.exec(`UPDATE webhook_endpoint_deliveries SET created_at = (SELECT created_at FROM webhook_endpoint_deliveries WHERE id = $1)
		WHERE id = $2`, all[1].id, all[2].id)
	all[1], all[2] = all[2], all[1]
	f.message("another", "payment.paid")

	want := make([]int64, len(all))
	for i, m := range all {
		want[i] = m.id
	}
	// Every page of 3, following the cursor.
	var got []int64
	var before int64
	for pages := 0; ; pages++ {
		if pages > len(all) {
			t.Fatal("the cursor does not end")
		}
		p, err := deliveries.List(f.ctx, f.pool, "acct", ep, deliveries.Filter{Limit: 3, Before: before})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(p.Data)...)
		if p.NextCursor == nil {
			break
		}
		if len(p.Data) != 3 || *p.NextCursor != p.Data[2].ID {
			t.Fatalf("page of %d, cursor %d", len(p.Data), *p.NextCursor)
		}
		before = *p.NextCursor
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages: %v, want newest first %v", got, want)
	}

	p, err := deliveries.List(f.ctx, f.pool, "acct", ep, deliveries.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Data) != len(all) || p.NextCursor != nil {
		t.Fatalf("default page: %d deliveries, cursor %v", len(p.Data), p.NextCursor)
	}
	for _, d := range p.Data {
		if d.EndpointID != ep || (d.Status == "pending") != (d.NextAttemptAt != nil) ||
			(d.Status == "failed") != (d.LastError != "") || (d.Status == "pending") == (d.SettledAt != nil) {
			t.Fatalf("delivery %+v: next attempt for pending only, error for failed, settled for settled", d)
		}
	}
	if d := p.Data[len(p.Data)-1]; d.MessageID != all[len(all)-1].msg || d.EventType != "payment.paid" || d.Attempts != 6 {
		t.Fatalf("oldest: %+v", d)
	}

	// Filters, alone and together.
	for _, c := range []struct {
		f    deliveries.Filter
		want []int64
	}{
		{deliveries.Filter{Status: "failed"}, []int64{all[2].id, all[4].id}},
		{deliveries.Filter{Status: "pending"}, []int64{all[0].id, all[5].id}},
		{deliveries.Filter{EventType: "payment.refunded"}, []int64{all[1].id, all[4].id}},
		{deliveries.Filter{Status: "delivered", EventType: "payment.paid"}, []int64{all[3].id, all[6].id}},
		{deliveries.Filter{Status: "delivered", Before: all[3].id}, []int64{all[6].id}},
		{deliveries.Filter{EventType: "nothing.*"}, []int64{}},
	} {
		p, err := deliveries.List(f.ctx, f.pool, "acct", ep, c.f)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(p.Data), c.want) || p.NextCursor != nil {
			t.Errorf("%+v: %v (cursor %v), want %v", c.f, ids(p.Data), p.NextCursor, c.want)
		}
	}

	// A cursor whose delivery was purged meanwhile: the rest by id (which
	// here, unlike in life, is not the creation order).
	f.exec(`DELETE FROM webhook_endpoint_deliveries WHERE id = $1`, all[3].id)
	p, err = deliveries.List(f.ctx, f.pool, "acct", ep, deliveries.Filter{Before: all[3].id})
	if err != nil {
		t.Fatal(err)
	}
	var older int
	for _, m := range all {
		if m.id < all[3].id {
			older++
		}
	}
	if len(p.Data) != older || slices.ContainsFunc(p.Data, func(d deliveries.Delivery) bool { return d.ID >= all[3].id }) {
		t.Fatalf("after a purged cursor %d: %v, want the %d deliveries of lower ids", all[3].id, ids(p.Data), older)
	}

	// Bad filters name their field.
	for field, bad := range map[string]deliveries.Filter{
		"status": {Status: "sent"}, "limit": {Limit: deliveries.MaxLimit + 1}, "before": {Before: -1},
	} {
		if _, err := deliveries.List(f.ctx, f.pool, "acct", ep, bad); !isValidation(err, field) {
			t.Errorf("%+v: %v, want a validation error of %s", bad, err, field)
		}
	}
	if _, err := deliveries.List(f.ctx, f.pool, "acct", ep, deliveries.Filter{Limit: -1}); !isValidation(err, "limit") {
		t.Errorf("limit -1: %v", err)
	}
	// Another account's endpoint, or no endpoint: not found alike.
	for _, e := range []string{foreign, uuid.NewString(), "not-a-uuid"} {
		if _, err := deliveries.List(f.ctx, f.pool, "acct", e, deliveries.Filter{}); !errors.Is(err, webhooks.ErrNotFound) {
			t.Errorf("endpoint %s: %v, want not found", e, err)
		}
	}
	if _, err := deliveries.List(f.ctx, f.pool, "another", ep, deliveries.Filter{}); !errors.Is(err, webhooks.ErrNotFound) {
		t.Errorf("another account's list of this endpoint: %v, want not found", err)
	}
}

func TestAttemptsNewestFirst(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep := f.endpoint("acct")
	m := f.message("acct", "payment.paid")
	untried := f.message("acct", "payment.paid")
	d := f.set(m, ep, "delivered", 3, time.Minute)
	f.exec(`INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, attempted_at, status_code, latency_ms, error, response_body, lease_lost)
		VALUES ($1, $2, now() - interval '50 seconds', NULL, 10000, 'timeout', NULL, false),
		       ($1, $2, now() - interval '10 seconds', 200, 12.5, NULL, '{"ok":true}', false),
		       ($1, $2, now() - interval '40 seconds', 503, 3, 'http 503', 'busy', true)`, d, ep)

	got, err := deliveries.Attempts(f.ctx, f.pool, "acct", ep, m)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d attempts, want 3", len(got))
	}
	for i := 1; i < len(got); i++ {
		if !got[i-1].AttemptedAt.After(got[i].AttemptedAt) {
			t.Fatalf("attempts not newest first: %v then %v", got[i-1].AttemptedAt, got[i].AttemptedAt)
		}
	}
	if a := got[0]; a.StatusCode == nil || *a.StatusCode != 200 || a.ResponseBody != `{"ok":true}` || a.Error != "" || a.LatencyMS != 12.5 {
		t.Fatalf("latest: %+v", a)
	}
	if a := got[1]; !a.LeaseLost || *a.StatusCode != 503 {
		t.Fatalf("second: %+v", a)
	}
	if a := got[2]; a.StatusCode != nil || a.Error != "timeout" {
		t.Fatalf("oldest: %+v", a)
	}
	// A delivery not tried yet: none, not an error.
	if got, err := deliveries.Attempts(f.ctx, f.pool, "acct", ep, untried); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("untried: %v %v, want an empty list", got, err)
	}
	for _, c := range []struct{ account, endpoint, message string }{
		{"another", ep, m},              // another account
		{"acct", ep, uuid.NewString()},  // no such message
		{"acct", f.endpoint("acct"), m}, // not delivered to that endpoint
		{"acct", ep, "x"},
	} {
		if _, err := deliveries.Attempts(f.ctx, f.pool, c.account, c.endpoint, c.message); !errors.Is(err, webhooks.ErrNotFound) {
			t.Errorf("%+v: %v, want not found", c, err)
		}
	}
}

func TestResend(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep := f.endpoint("acct")
	msg := func(status string, attempts int) string {
		m := f.message("acct", "payment.paid")
		f.set(m, ep, status, attempts, time.Hour)
		return m
	}
	again := state{Status: "pending", Due: true}
	for _, status := range []string{"failed", "delivered", "pending"} {
		m := msg(status, 10)
		d, err := deliveries.Resend(f.ctx, f.pool, "acct", ep, m)
		if err != nil {
			t.Fatalf("%s: %v", status, err)
		}
		if d.Status != "pending" || d.Attempts != 0 || d.NextAttemptAt == nil || d.SettledAt != nil || d.LastError != "" || d.MessageID != m {
			t.Fatalf("%s resent: %+v", status, d)
		}
		if s := f.state(m, ep); s != again {
			t.Fatalf("%s resent: %+v, want %+v", status, s, again)
		}
	}

	// In flight: left to its attempt, answered as it is.
	leased := msg("pending", 2)
	f.lease(leased, ep, time.Minute)
	d, err := deliveries.Resend(f.ctx, f.pool, "acct", ep, leased)
	if err != nil {
		t.Fatal(err)
	}
	if s := f.state(leased, ep); d.Attempts != 2 || !s.Leased || s.Attempts != 2 || s.Due {
		t.Fatalf("leased delivery resent: %+v %+v, want its lease kept", d, s)
	}
	// A lapsed lease: its sender is gone; the token goes too.
	lapsed := msg("pending", 2)
	f.lease(lapsed, ep, -time.Minute)
	if _, err := deliveries.Resend(f.ctx, f.pool, "acct", ep, lapsed); err != nil {
		t.Fatal(err)
	}
	if s := f.state(lapsed, ep); s != again {
		t.Fatalf("lapsed lease resent: %+v", s)
	}

	// An open circuit: it waits for the circuit's end, as new ones do.
	f.exec(`UPDATE webhook_endpoints SET circuit_open_until = now() + interval '1 hour' WHERE id = $1`, ep)
	waiting := msg("failed", 3)
	d, err = deliveries.Resend(f.ctx, f.pool, "acct", ep, waiting)
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != "pending" || d.NextAttemptAt.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("resent with the circuit open: %+v, want due at the circuit's end", d)
	}

	// Disabled: refused, nothing changed.
	failed := msg("failed", 10)
	f.disable(ep)
	if _, err := deliveries.Resend(f.ctx, f.pool, "acct", ep, failed); !errors.Is(err, deliveries.ErrEndpointDisabled) {
		t.Fatalf("disabled endpoint: %v, want ErrEndpointDisabled", err)
	}
	if s := f.state(failed, ep); s.Status != "failed" || s.Attempts != 10 {
		t.Fatalf("resend to a disabled endpoint changed the delivery: %+v", s)
	}

	ep2 := f.endpoint("acct")
	m2 := f.message("acct", "payment.paid")
	f.set(m2, ep2, "failed", 10, time.Hour)
	for _, c := range []struct{ account, endpoint, message string }{
		{"another", ep2, m2},                  // another account
		{"acct", ep2, uuid.NewString()},       // no such message
		{"acct", ep2, failed},                 // a message never for that endpoint
		{"acct", uuid.NewString(), m2},        // no such endpoint
		{"acct", "x", m2}, {"acct", ep2, "x"}, // not ids
	} {
		if _, err := deliveries.Resend(f.ctx, f.pool, c.account, c.endpoint, c.message); !errors.Is(err, webhooks.ErrNotFound) {
			t.Errorf("%+v: %v, want not found", c, err)
		}
	}
	if s := f.state(m2, ep2); s.Status != "failed" {
		t.Fatalf("another account resent it: %+v", s)
	}
}

func TestRecover(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep := f.endpoint("acct")
	other := f.endpoint("acct")
	since := time.Now().Add(-time.Hour)

	type c struct {
		status string
		age    time.Duration
		want   string // after Recover
	}
	cases := []c{
		{"failed", 10 * time.Minute, "pending"},
		{"failed", 59 * time.Minute, "pending"},
		{"failed", 2 * time.Hour, "failed"}, // before since
		{"delivered", 10 * time.Minute, "delivered"},
		{"pending", 10 * time.Minute, "pending"},
	}
	msgs := make([]string, len(cases))
	for i, cs := range cases {
		msgs[i] = f.message("acct", "payment.paid")
		f.set(msgs[i], ep, cs.status, 10, cs.age)
		f.set(msgs[i], other, "failed", 10, cs.age) // another endpoint's: stays failed
	}
	n, err := deliveries.Recover(f.ctx, f.pool, "acct", ep, since)
	if err != nil || n != 2 {
		t.Fatalf("Recover = %d, %v; want 2", n, err)
	}
	for i, cs := range cases {
		s := f.state(msgs[i], ep)
		if s.Status != cs.want {
			t.Errorf("%+v: %s after recover", cs, s.Status)
		}
		if cs.status == "failed" && cs.want == "pending" && (s.Attempts != 0 || !s.Due || s.Settled || s.Error) {
			t.Errorf("%+v recovered: %+v, want due now from attempt 0", cs, s)
		}
		if s := f.state(msgs[i], other); s.Status != "failed" {
			t.Errorf("the other endpoint's delivery: %s", s.Status)
		}
	}
	if n, err := deliveries.Recover(f.ctx, f.pool, "another", other, since); !errors.Is(err, webhooks.ErrNotFound) || n != 0 {
		t.Fatalf("another account: %d, %v", n, err)
	}
	if _, err := deliveries.Recover(f.ctx, f.pool, "acct", "x", since); !errors.Is(err, webhooks.ErrNotFound) {
		t.Fatalf("no endpoint: %v", err)
	}
	f.disable(other)
	if _, err := deliveries.Recover(f.ctx, f.pool, "acct", other, since); !errors.Is(err, deliveries.ErrEndpointDisabled) {
		t.Fatalf("disabled: %v, want ErrEndpointDisabled", err)
	}
	if s := f.state(msgs[0], other); s.Status != "failed" {
		t.Fatalf("recover of a disabled endpoint changed it: %+v", s)
	}
}

func TestSendTest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep := f.endpoint("acct", "payment.*") // its filter does not list the test type
	sibling := f.endpoint("acct")         // every type: still not sent the test
	foreign := f.endpoint("another")

	id, err := deliveries.SendTest(f.ctx, f.pool, "acct", ep)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := uuid.Parse(id); err != nil || v.Version() != 7 {
		t.Fatalf("message id %q: want a uuid v7", id)
	}
	var (
		typ, account string
		payload      []byte
		endpoints    []string
	)
	if err := f.pool.QueryRow(f.ctx, `SELECT m.event_type, m.account_id, m.payload,
		(SELECT array_agg(endpoint_id::text) FROM webhook_endpoint_deliveries WHERE message_id = m.id AND status = 'pending')
		FROM webhook_messages m WHERE m.id = $1`, id).Scan(&typ, &account, &payload, &endpoints); err != nil {
		t.Fatal(err)
	}
	var data webhooks.TestEvent
	if err := json.Unmarshal(payload, &data); err != nil || data.EndpointID != ep || data.Message == "" {
		t.Fatalf("payload %s (%v)", payload, err)
	}
	if typ != webhooks.EventTest || account != "acct" || !slices.Equal(endpoints, []string{ep}) {
		t.Fatalf("test event: %s of %s to %v, want %s to %s only (not %s)", typ, account, endpoints, webhooks.EventTest, ep, sibling)
	}
	if got, err := deliveries.Attempts(f.ctx, f.pool, "acct", ep, id); err != nil || len(got) != 0 {
		t.Fatalf("attempts of the test event: %v %v", got, err)
	}

	for _, e := range []string{foreign, uuid.NewString(), "x"} {
		if _, err := deliveries.SendTest(f.ctx, f.pool, "acct", e); !errors.Is(err, webhooks.ErrNotFound) {
			t.Errorf("endpoint %s: %v, want not found", e, err)
		}
	}
	f.disable(ep)
	if _, err := deliveries.SendTest(f.ctx, f.pool, "acct", ep); !errors.Is(err, deliveries.ErrEndpointDisabled) {
		t.Fatalf("disabled: %v", err)
	}
	var n int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM webhook_messages`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d messages, want only the first test event (refused and another account's record nothing)", n)
	}
}

// A resend racing the sender's disabling of the endpoint waits for it,
// then is refused: it never leaves a pending delivery to a disabled
// endpoint (the disabling failed the pending ones it saw).
func TestResendWaitsForADisable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep := f.endpoint("acct")
	m := f.message("acct", "payment.paid")
	f.set(m, ep, "failed", 10, time.Hour)

	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(f.ctx) }()
	if _, err := tx.Exec(f.ctx, `UPDATE webhook_endpoints SET disabled_at = now(), disabled_reason = 'failing' WHERE id = $1`, ep); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := deliveries.Resend(f.ctx, f.pool, "acct", ep, m)
		done <- err
	}()
	outflowtest.WaitFor(t, 10*time.Second, "the resend to wait for the endpoint, or end", func() bool {
		if len(done) > 0 {
			return true
		}
		var n int
		_ = f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%webhook_endpoint_deliveries d SET%'`).Scan(&n)
		return n > 0
	})
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, deliveries.ErrEndpointDisabled) {
		t.Fatalf("resend during the disable: %v, want ErrEndpointDisabled", err)
	}
	if s := f.state(m, ep); s.Status != "failed" {
		t.Fatalf("delivery %+v after a resend raced the disable", s)
	}
}
