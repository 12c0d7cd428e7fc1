package fanout_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

// The test service's events: payments of an account, and a version-2
// payload whose version-1 form is upcast on decoding.
type paid struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

func (paid) EventType() string { return "payment.paid" }

type refunded struct {
	Account string `json:"account"`
	Cents   int    `json:"cents"`
}

func (refunded) EventType() string  { return "payment.refunded" }
func (refunded) SchemaVersion() int { return 2 }

const aggregate = "payment"

var errUnknownAccount = errors.New("unknown account")

func registry(t *testing.T) *events.Registry {
	t.Helper()
	reg := events.NewRegistry()
	if err := reg.Register(paid{}); err != nil {
		t.Fatal(err)
	}
	// Version 1 of payment.refunded had "amount" in units.
	if err := reg.RegisterVersioned(refunded{}, events.Upcaster{From: 1, Func: func(raw json.RawMessage) (json.RawMessage, error) {
		var v1 struct {
			Account string `json:"account"`
			Amount  int    `json:"amount"`
		}
		if err := json.Unmarshal(raw, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(refunded{Account: v1.Account, Cents: v1.Amount * 100})
	}}); err != nil {
		t.Fatal(err)
	}
	return reg
}

// account reads the account from the payload; "nobody" is no account's
// event, and an account starting with "unknown" is not the service's.
func account(_ context.Context, _ pgx.Tx, ev events.Event) (string, error) {
	var a string
	switch p := ev.Payload.(type) {
	case paid:
		a = p.Account
	case refunded:
		a = p.Account
	}
	switch {
	case a == "nobody":
		return "", nil
	case strings.HasPrefix(a, "unknown"):
		return "", errUnknownAccount
	}
	return a, nil
}

func insertEndpoint(t *testing.T, pool *pgxpool.Pool, account string, types []string, disabled bool) string {
	t.Helper()
	id := uuid.NewString()
	if types == nil {
		types = []string{} // every type
	}
	var reason *string
	if disabled {
		r := "manual"
		reason = &r
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO webhook_endpoints
		(id, account_id, url, event_types, secret, disabled_at, disabled_reason)
		VALUES ($1, $2, 'https://example.com/hook', $3, 'whsec_AAAA', CASE WHEN $4::text IS NOT NULL THEN now() END, $4)`,
		id, account, types, reason); err != nil {
		t.Fatal(err)
	}
	return id
}

func newEvent(t *testing.T, id string, version int64, p events.Payload) events.Event {
	t.Helper()
	ev, err := events.New(context.Background(), events.Aggregate{Type: aggregate, ID: id, Version: version}, p)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// recorded is what the webhook tables hold for a message id.
type recorded struct {
	Messages, Deliveries, Pending int
}

func countOf(t *testing.T, pool *pgxpool.Pool, messageID string) recorded {
	t.Helper()
	var r recorded
	if err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM webhook_messages WHERE id = $1),
		(SELECT count(*) FROM webhook_endpoint_deliveries WHERE message_id = $1),
		(SELECT count(*) FROM webhook_endpoint_deliveries WHERE message_id = $1 AND status = 'pending')`,
		messageID).Scan(&r.Messages, &r.Deliveries, &r.Pending); err != nil {
		t.Fatal(err)
	}
	return r
}

// Through the real idempotency middleware: the message is the event, it
// is recorded once whatever the redeliveries and crashes, and the
// handler's types and the endpoints' filters both narrow it.
func TestHandlerRecordsEachEventOnce(t *testing.T) {
	t.Parallel()
	const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx := events.WithTraceparent(context.Background(), traceparent) // the handler's span's
	s := outflowtest.NewSchema(t, schema.Set())
	reg := registry(t)
	paidOnly := insertEndpoint(t, s.Pool, "acct-1", []string{"payment.paid"}, false)
	all := insertEndpoint(t, s.Pool, "acct-1", nil, false)
	insertEndpoint(t, s.Pool, "acct-2", nil, false)

	h := fanout.Handler("webhooks", aggregate, fanout.Config{Account: account})
	hh := outflowtest.NewHandlerHarness(t, s.Pool, reg, h)

	ev := newEvent(t, "pay-1", 1, paid{Account: "acct-1", Amount: 7})
	got := hh.RequireIdempotent(ctx, ev, func(ctx context.Context) any { return countOf(t, s.Pool, ev.MessageID) })
	if want := (recorded{Messages: 1, Deliveries: 2, Pending: 2}); got != want {
		t.Fatalf("after the event: %+v, want %+v", got, want)
	}
	var (
		acct, typ, tp string
		occurred      time.Time
		version       int
		payload       []byte
	)
	if err := s.Pool.QueryRow(ctx, `SELECT account_id, event_type, occurred_at, schema_version, payload, traceparent
		FROM webhook_messages WHERE id = $1`, ev.MessageID).Scan(&acct, &typ, &occurred, &version, &payload, &tp); err != nil {
		t.Fatal(err)
	}
	if acct != "acct-1" || typ != "payment.paid" || occurred.Sub(ev.OccurredAt).Abs() > time.Microsecond || version != 1 ||
		string(payload) != `{"account":"acct-1","amount":7}` || tp != traceparent {
		t.Fatalf("message = %s %s %s v%d %s %q, want the event's", acct, typ, occurred, version, payload, tp)
	}

	// A refund: only the endpoint without a filter wants it. Written at
	// version 1, it is recorded as the handler decoded it: version 2.
	env := newEvent(t, "pay-1", 2, refunded{Account: "acct-1", Cents: 300})
	msg, err := env.Message(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg.Payload = []byte(`{"account":"acct-1","amount":3}`)
	delete(msg.Metadata, events.SchemaVersionKey)
	if d := hh.DeliverMessage(ctx, msg); d.Outcome != outflowtest.Applied {
		t.Fatalf("refund: %s %v", d.Outcome, d.Err)
	}
	var endpoint string
	if err := s.Pool.QueryRow(ctx, `SELECT endpoint_id::text FROM webhook_endpoint_deliveries WHERE message_id = $1`,
		env.MessageID).Scan(&endpoint); err != nil || endpoint != all {
		t.Fatalf("refund went to %s (%v), want only %s (not %s)", endpoint, err, all, paidOnly)
	}
	if err := s.Pool.QueryRow(ctx, `SELECT schema_version, payload FROM webhook_messages WHERE id = $1`,
		env.MessageID).Scan(&version, &payload); err != nil {
		t.Fatal(err)
	}
	if version != 2 || string(payload) != `{"account":"acct-1","cents":300}` {
		t.Fatalf("refund recorded as v%d %s, want v2 as decoded", version, payload)
	}

	// An event of no account, and one no endpoint of its account wants,
	// record nothing.
	for _, ev := range []events.Event{
		newEvent(t, "pay-2", 1, paid{Account: "nobody", Amount: 1}),
		newEvent(t, "pay-3", 1, paid{Account: "acct-3", Amount: 1}),
	} {
		if d := hh.Deliver(ctx, ev); d.Outcome != outflowtest.Applied || d.Calls != 1 {
			t.Fatalf("%s: %s (%d calls) %v", ev.Payload, d.Outcome, d.Calls, d.Err)
		}
		if got := countOf(t, s.Pool, ev.MessageID); got != (recorded{}) {
			t.Fatalf("%v recorded %+v, want nothing", ev.Payload, got)
		}
	}
}

// A handler listing event types does not see the others.
func TestHandlerListedTypesOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, schema.Set())
	insertEndpoint(t, s.Pool, "acct-1", nil, false)
	h := fanout.Handler("webhooks", aggregate, fanout.Config{Account: account}, "payment.paid")
	hh := outflowtest.NewHandlerHarness(t, s.Pool, registry(t), h)

	refund := newEvent(t, "pay-1", 1, refunded{Account: "acct-1", Cents: 1})
	if d := hh.Deliver(ctx, refund); d.Outcome != outflowtest.Applied || d.Calls != 0 {
		t.Fatalf("refund: %s, %d calls; want applied unseen", d.Outcome, d.Calls)
	}
	if got := countOf(t, s.Pool, refund.MessageID); got != (recorded{}) {
		t.Fatalf("a type the handler does not list recorded %+v", got)
	}
	pay := newEvent(t, "pay-1", 2, paid{Account: "acct-1", Amount: 1})
	if d := hh.Deliver(ctx, pay); d.Outcome != outflowtest.Applied || d.Calls != 1 {
		t.Fatalf("payment: %s, %d calls", d.Outcome, d.Calls)
	}
	if got := countOf(t, s.Pool, pay.MessageID); got != (recorded{Messages: 1, Deliveries: 1, Pending: 1}) {
		t.Fatalf("payment recorded %+v", got)
	}
}

// An account the service does not know fails the message (retried, then
// dead-lettered), and records nothing; the error is Account's, wrapped.
func TestHandlerUnknownAccountFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, schema.Set())
	insertEndpoint(t, s.Pool, "unknown-1", nil, false)
	h := fanout.Handler("webhooks", aggregate, fanout.Config{Account: account})
	hh := outflowtest.NewHandlerHarness(t, s.Pool, registry(t), h)

	ev := newEvent(t, "pay-1", 1, paid{Account: "unknown-1", Amount: 1})
	d := hh.Deliver(ctx, ev)
	if d.Outcome != outflowtest.Failed || d.Err == nil || !strings.Contains(d.Err.Error(), errUnknownAccount.Error()) {
		t.Fatalf("unknown account: %s %v; want failed with %q", d.Outcome, d.Err, errUnknownAccount)
	}
	if got := countOf(t, s.Pool, ev.MessageID); got != (recorded{}) {
		t.Fatalf("recorded %+v for an unknown account", got)
	}
	// Called directly, the error is Account's.
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return h.Func(ctx, tx, ev) })
	if !errors.Is(err, errUnknownAccount) {
		t.Fatalf("Func = %v, want %v", err, errUnknownAccount)
	}
}

// Without the consumer's deduplication (an operator's replay to a new
// consumer name, a message id delivered twice): the handler's own
// statement records the message once.
func TestHandlerFuncTwiceRecordsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, schema.Set())
	insertEndpoint(t, s.Pool, "acct-1", nil, false)
	insertEndpoint(t, s.Pool, "acct-1", nil, false)
	h := fanout.Handler("webhooks", aggregate, fanout.Config{Account: account})
	ev := newEvent(t, "pay-1", 1, paid{Account: "acct-1", Amount: 1})
	for range 2 {
		if err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return h.Func(ctx, tx, ev) }); err != nil {
			t.Fatal(err)
		}
	}
	if got := countOf(t, s.Pool, ev.MessageID); got != (recorded{Messages: 1, Deliveries: 2, Pending: 2}) {
		t.Fatalf("twice: %+v, want one message, two deliveries", got)
	}
}

// Through a real worker: Wake comes after the commit of a message that
// recorded a pending delivery (what Wake's caller reads is there), and
// only then: not for an event nobody wants, nor one whose only endpoint
// is disabled (its delivery is recorded failed).
func TestHandlerWakesAfterCommitOnlyWhenPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, schema.Set())
	insertEndpoint(t, s.Pool, "acct-1", nil, false)
	insertEndpoint(t, s.Pool, "acct-off", nil, true)

	var (
		mu     sync.Mutex
		woken  int
		seen   []int64 // pending deliveries visible from another connection at each wake
		nWakes atomic.Int32
	)
	wake := func() {
		var n int64
		_ = s.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'pending'`).Scan(&n)
		mu.Lock()
		woken++
		seen = append(seen, n)
		mu.Unlock()
		nWakes.Add(1)
	}
	h := fanout.Handler("webhooks", aggregate, fanout.Config{Account: account, Wake: wake})
	p := outflowtest.StartPipeline(t, s.Pool, registry(t), []consumer.Handler{h})

	write := func(evs ...events.Event) {
		t.Helper()
		w, err := outbox.NewWriter(outbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, evs...) }); err != nil {
			t.Fatal(err)
		}
	}
	write(newEvent(t, "pay-1", 1, paid{Account: "acct-1", Amount: 1}))
	p.WaitHandled()
	outflowtest.WaitFor(t, 10*time.Second, "the wake", func() bool { return nWakes.Load() == 1 })

	write(newEvent(t, "pay-2", 1, paid{Account: "acct-2", Amount: 1}), // no endpoint
		newEvent(t, "pay-3", 1, paid{Account: "nobody", Amount: 1}),   // no account
		newEvent(t, "pay-4", 1, paid{Account: "acct-off", Amount: 1})) // disabled: recorded failed
	p.WaitHandled()
	write(newEvent(t, "pay-1", 2, paid{Account: "acct-1", Amount: 2}))
	p.WaitHandled()
	outflowtest.WaitFor(t, 10*time.Second, "the second wake", func() bool { return nWakes.Load() >= 2 })

	mu.Lock()
	defer mu.Unlock()
	if woken != 2 {
		t.Fatalf("%d wakes, want 2: one per event that recorded a pending delivery", woken)
	}
	for i, n := range seen {
		if n != int64(i+1) {
			t.Fatalf("wake %d saw %d pending deliveries, want %d: it came before the commit", i+1, n, i+1)
		}
	}
}
