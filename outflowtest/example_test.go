package outflowtest_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
)

// An event type of the service under test.
type PayoutRequested struct {
	PayoutID string `json:"payout_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func (PayoutRequested) EventType() string { return "payout.requested" }

// exampleT stands in for the *testing.T a real test gets: examples have
// none. In your tests, pass t.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (*exampleT) Helper()                   {}
func (*exampleT) Output() io.Writer         { return io.Discard }
func (e *exampleT) Cleanup(f func())        { e.cleanups = append(e.cleanups, f) }
func (*exampleT) Errorf(f string, a ...any) { fmt.Fprintf(os.Stdout, f+"\n", a...) }
func (*exampleT) FailNow()                  { panic(failed{}) }
func (e *exampleT) Fatalf(f string, a ...any) {
	e.Errorf(f, a...)
	e.FailNow()
}

// failed ends a failing assertion in an example, as FailNow ends a test.
type failed struct{}

// reportFailure runs f, an assertion expected to fail, and lets the
// example go on after it.
func reportFailure(f func()) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(failed); !ok {
				panic(r)
			}
		}
	}()
	f()
}

func (e *exampleT) finish() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

func exampleSetup(t testing.TB) (*outflowtest.Schema, *events.Registry) {
	s := outflowtest.NewSchema(t)
	// The service's own table.
	if _, err := s.Pool.Exec(context.Background(),
		`CREATE TABLE payout_totals (currency text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		t.Fatalf("%v", err)
	}
	reg := events.NewRegistry()
	if err := reg.Register(PayoutRequested{}); err != nil {
		t.Fatalf("%v", err)
	}
	return s, reg
}

// The handler under test: it writes its effect in the transaction it is
// given, so the effect commits with the message's bookkeeping or not at all.
var totals = consumer.Handler{
	Name:  "payout-totals",
	Topic: "payout",
	Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		p := ev.Payload.(PayoutRequested)
		_, err := tx.Exec(ctx, `INSERT INTO payout_totals VALUES ($1, $2)
			ON CONFLICT (currency) DO UPDATE SET amount = payout_totals.amount + $2`, p.Currency, p.Amount)
		return err
	},
}

func total(pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, currency string) int64 {
	var n int64
	_ = pool.QueryRow(context.Background(), `SELECT amount FROM payout_totals WHERE currency = $1`, currency).Scan(&n)
	return n
}

func newPayout(id string, version, amount int64) events.Event {
	ev, err := events.New(context.Background(), events.Aggregate{Type: "payout", ID: id, Version: version},
		PayoutRequested{PayoutID: id, Amount: amount, Currency: "EUR"})
	if err != nil {
		panic(err)
	}
	return ev
}

// Check what a command's transaction wrote to the outbox, before it
// commits.
func ExampleRequireEvent() {
	t := &exampleT{}
	defer t.finish()
	ctx := context.Background()
	s, _ := exampleSetup(t)
	writer, _ := outbox.NewWriter(outbox.Config{})

	tx, _ := s.Pool.Begin(ctx)
	defer tx.Rollback(ctx)
	_ = writer.PublishTx(ctx, tx, newPayout("po_1", 1, 500)) // the command under test

	got := outflowtest.RequireEvent(ctx, t, tx, outflowtest.Want{
		Type: "payout.requested", AggregateType: "payout", AggregateID: "po_1", Version: 1,
		Payload: map[string]any{"amount": 500}, // a subset of the payload
	})
	fmt.Println(got.EventType, got.AggregateID, got.AggregateVersion, got.Topic)
	outflowtest.RequireNoEvent(ctx, t, tx, outflowtest.Want{AggregateID: "po_2"})

	// A mismatch fails the test and says what was written instead.
	reportFailure(func() { outflowtest.RequireEvent(ctx, t, tx, outflowtest.Want{Type: "payout.requested", Version: 2}) })
	// Output:
	// payout.requested po_1 1 payout
	// outflowtest: no event in the outbox matches {type=payout.requested version=2}; it holds 1 event(s):
	//   1. payout.requested payout/po_1 v1 topic=payout {"amount": 500, "currency": "EUR", "payout_id": "po_1"} (version 1)
}

// Run a handler through the real idempotency middleware, synchronously:
// a duplicate and an out-of-order delivery included.
func ExampleHandlerHarness() {
	t := &exampleT{}
	defer t.finish()
	ctx := context.Background()
	s, reg := exampleSetup(t)
	h := outflowtest.NewHandlerHarness(t, s.Pool, reg, totals)

	v1, v2 := newPayout("po_1", 1, 500), newPayout("po_1", 2, 700)
	fmt.Println(h.Deliver(ctx, v2).Outcome, total(s.Pool, "EUR")) // v2 first: it waits for v1
	d := h.Deliver(ctx, v1)
	fmt.Println(d.Outcome, len(d.Released), total(s.Pool, "EUR")) // v1 applies, then v2
	fmt.Println(h.Redeliver(ctx, v1).Outcome, total(s.Pool, "EUR"))
	// Output:
	// held 0
	// applied 1 1200
	// duplicate 1200
}

// Prove the handler writes nothing outside its transaction: a crash after
// it returned must leave no trace, and the message then applies once.
func ExampleHandlerHarness_RequireIdempotent() {
	t := &exampleT{}
	defer t.finish()
	ctx := context.Background()
	s, reg := exampleSetup(t)
	h := outflowtest.NewHandlerHarness(t, s.Pool, reg, totals)

	after := h.RequireIdempotent(ctx, newPayout("po_1", 1, 500), func(context.Context) any { return total(s.Pool, "EUR") })
	fmt.Println(after)
	// Output:
	// 500
}

// Run the forwarder and the worker in-process over PostgreSQL alone, and
// make the forwarder die after the broker took a batch and before it
// marked it: the message arrives twice and applies once.
func ExampleStartPipeline() {
	t := &exampleT{}
	defer t.finish()
	ctx := context.Background()
	s, reg := exampleSetup(t)
	p := outflowtest.StartPipeline(t, s.Pool, reg, []consumer.Handler{totals})
	p.CrashAfterPublish(1)

	writer, _ := outbox.NewWriter(outbox.Config{})
	ev := newPayout("po_1", 1, 500)
	_ = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return writer.PublishTx(ctx, tx, ev) })
	p.WaitHandled()
	fmt.Println(p.Published(ev.MessageID), total(s.Pool, "EUR"))
	// Output:
	// 2 500
}

// A handler that writes outside the transaction it is given (here through
// the pool) is caught by a crash after its writes: the message is retried
// and the effect happens twice.
func ExamplePipeline_CrashInHandler() {
	t := &exampleT{}
	defer t.finish()
	ctx := context.Background()
	s, reg := exampleSetup(t)
	leaky := totals
	leaky.Func = func(ctx context.Context, _ pgx.Tx, ev events.Event) error {
		p := ev.Payload.(PayoutRequested)
		_, err := s.Pool.Exec(ctx, `INSERT INTO payout_totals VALUES ($1, $2)
			ON CONFLICT (currency) DO UPDATE SET amount = payout_totals.amount + $2`, p.Currency, p.Amount)
		return err
	}
	p := outflowtest.StartPipeline(t, s.Pool, reg, []consumer.Handler{leaky})
	p.CrashInHandler(leaky.Name, 1)

	writer, _ := outbox.NewWriter(outbox.Config{})
	_ = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return writer.PublishTx(ctx, tx, newPayout("po_1", 1, 500)) })
	p.WaitHandled()
	fmt.Println(total(s.Pool, "EUR"), "(500 expected: the handler must write in tx)")
	// Output:
	// 1000 (500 expected: the handler must write in tx)
}
