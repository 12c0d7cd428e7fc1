package outflowtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
)

func TestHarnessAppliesAndDeduplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kitSchema(t)
	h := NewHandlerHarness(t, s.Pool, testRegistry(t), balanceHandler(ledgerAggregate))

	v1 := newEvent(t, "acc-1", 1, credited{Account: "acc-1", Amount: 10})
	d := h.Deliver(ctx, v1)
	require.Equal(t, Applied, d.Outcome, d.Err)
	require.Equal(t, 1, d.Calls)
	require.Equal(t, balance{Amount: 10, Applied: []string{"1"}}, readBalance(t, s.Pool, "acc-1"))

	d = h.Redeliver(ctx, v1)
	require.Equal(t, Duplicate, d.Outcome)
	require.Zero(t, d.Calls)
	require.Equal(t, balance{Amount: 10, Applied: []string{"1"}}, readBalance(t, s.Pool, "acc-1"))

	// Another message with a version already applied: stale, not run.
	d = h.Deliver(ctx, newEvent(t, "acc-1", 1, credited{Account: "acc-1", Amount: 99}))
	require.Equal(t, Stale, d.Outcome)
	require.Zero(t, d.Calls)

	// A type the handler does not list applies unseen: its version counts.
	d = h.Deliver(ctx, newEvent(t, "acc-1", 2, closed{Account: "acc-1"}))
	require.Equal(t, Applied, d.Outcome)
	require.Zero(t, d.Calls)
	d = h.Deliver(ctx, newEvent(t, "acc-1", 3, credited{Account: "acc-1", Amount: 1}))
	require.Equal(t, Applied, d.Outcome)
	require.Equal(t, balance{Amount: 11, Applied: []string{"1", "3"}}, readBalance(t, s.Pool, "acc-1"))
}

func TestHarnessOutOfOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kitSchema(t)
	h := NewHandlerHarness(t, s.Pool, testRegistry(t), balanceHandler(ledgerAggregate))

	v1 := newEvent(t, "acc-2", 1, credited{Account: "acc-2", Amount: 1})
	v2 := newEvent(t, "acc-2", 2, credited{Account: "acc-2", Amount: 20})
	v3 := newEvent(t, "acc-2", 3, credited{Account: "acc-2", Amount: 300})

	require.Equal(t, Held, h.Deliver(ctx, v3).Outcome)
	require.Equal(t, Held, h.Deliver(ctx, v2).Outcome)
	require.Equal(t, balance{}, readBalance(t, s.Pool, "acc-2"), "nothing applies before version 1")

	d := h.Deliver(ctx, v1)
	require.Equal(t, Applied, d.Outcome)
	require.Equal(t, []string{v2.MessageID, v3.MessageID}, d.Released)
	require.Equal(t, 3, d.Calls)
	require.Equal(t, balance{Amount: 321, Applied: []string{"1", "2", "3"}}, readBalance(t, s.Pool, "acc-2"),
		"effects once each, in version order")

	// The parked ones arriving again are duplicates.
	require.Equal(t, Duplicate, h.Redeliver(ctx, v3).Outcome)
}

func TestHarnessFailureRollsBackAndRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kitSchema(t)
	fail := true
	hd := balanceHandler(ledgerAggregate)
	inner := hd.Func
	hd.Func = func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		if err := inner(ctx, tx, ev); err != nil {
			return err
		}
		if fail {
			return errors.New("downstream says no")
		}
		return nil
	}
	h := NewHandlerHarness(t, s.Pool, testRegistry(t), hd)
	v1 := newEvent(t, "acc-3", 1, credited{Account: "acc-3", Amount: 5})
	v2 := newEvent(t, "acc-3", 2, credited{Account: "acc-3", Amount: 6})

	d := h.Deliver(ctx, v1)
	require.Equal(t, Failed, d.Outcome)
	require.ErrorContains(t, d.Err, "downstream says no")
	require.Equal(t, balance{}, readBalance(t, s.Pool, "acc-3"), "the failed handler's writes rolled back")
	require.Equal(t, Held, h.Deliver(ctx, v2).Outcome, "held behind the failed version")

	fail = false
	require.Equal(t, []string{v1.MessageID, v2.MessageID}, h.Retry(ctx))
	require.Equal(t, balance{Amount: 11, Applied: []string{"1", "2"}}, readBalance(t, s.Pool, "acc-3"))
}

func TestHarnessCrashInsideHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kitSchema(t)
	h := NewHandlerHarness(t, s.Pool, testRegistry(t), balanceHandler(ledgerAggregate))
	v1 := newEvent(t, "acc-4", 1, credited{Account: "acc-4", Amount: 7})

	d := h.DeliverCrashing(ctx, v1)
	require.Equal(t, Failed, d.Outcome)
	require.ErrorContains(t, d.Err, "crash injected")
	require.Equal(t, 1, d.Calls)
	require.Equal(t, balance{}, readBalance(t, s.Pool, "acc-4"), "the crashed transaction's writes are gone")
	require.Equal(t, []string{v1.MessageID}, h.Retry(ctx))
	require.Equal(t, balance{Amount: 7, Applied: []string{"1"}}, readBalance(t, s.Pool, "acc-4"))
}

func TestRequireIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kitSchema(t)
	reg := testRegistry(t)

	t.Run("correct handler passes", func(t *testing.T) {
		h := NewHandlerHarness(t, s.Pool, reg, balanceHandler(ledgerAggregate))
		got := h.RequireIdempotent(ctx, newEvent(t, "acc-5", 1, credited{Account: "acc-5", Amount: 3}),
			func(context.Context) any { return readBalance(t, s.Pool, "acc-5") })
		require.Equal(t, balance{Amount: 3, Applied: []string{"1"}}, got)
	})
	t.Run("handler writing outside its transaction is caught", func(t *testing.T) {
		h := NewHandlerHarness(t, s.Pool, reg, leakyHandler(s.Pool, ledgerAggregate))
		msg := fails(func(rt testingT) {
			h.requireIdempotent(ctx, rt, newEvent(t, "acc-6", 1, credited{Account: "acc-6", Amount: 3}),
				func(context.Context) any { return countSideEffects(t, s.Pool) })
		})
		require.Contains(t, msg, `handler "leaky" changed effects in a delivery whose transaction rolled back`)
		require.Contains(t, msg, "writes outside the transaction")
	})
	t.Run("with MaxBatch 1 a crash is nacked and redelivered", func(t *testing.T) {
		hd := balanceHandler(ledgerAggregate)
		hd.Name = "balances-one"
		h := NewHandlerHarness(t, s.Pool, reg, hd, WithIdempotency(idempotencyOne()))
		ev := newEvent(t, "acc-7", 1, credited{Account: "acc-7", Amount: 4})
		got := h.RequireIdempotent(ctx, ev, func(context.Context) any { return readBalance(t, s.Pool, "acc-7") })
		require.Equal(t, balance{Amount: 4, Applied: []string{"1"}}, got)
	})
}

func TestHarnessNeedsNameAndFunc(t *testing.T) {
	t.Parallel()
	// panicTB turns the harness's Fatalf into a panic the test can see.
	require.Panics(t, func() {
		NewHandlerHarness(panicTB{t}, nil, testRegistry(t), consumer.Handler{Name: "x"})
	})
}

// A handler listing a type the registry does not know fails the harness,
// naming it, as Worker.Add would: delivered events of the intended type
// would otherwise pass it unseen and the test would prove nothing.
func TestHarnessRefusesUnregisteredEventTypes(t *testing.T) {
	t.Parallel()
	hd := balanceHandler(ledgerAggregate)
	hd.EventTypes = []string{"account.credit"}
	msg := panicMessage(func() { NewHandlerHarness(panicTB{t}, nil, testRegistry(t), hd) })
	require.Contains(t, msg, `handler "balances" lists event type "account.credit": event type not registered`)
}

// What a command wrote can be fed to the handler as the forwarder would
// send it.
func TestHarnessDeliversWhatTheOutboxHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := kitSchema(t)
	ev := newEvent(t, "acc-8", 1, credited{Account: "acc-8", Amount: 8})
	ev.CorrelationID = "req-8"
	writeEvents(t, s.Pool, ev)
	w := RequireEvent(ctx, t, s.Pool, Want{AggregateID: "acc-8"})
	require.Equal(t, "req-8", w.Metadata[events.CorrelationIDKey])

	var seen events.Event
	hd := balanceHandler(ledgerAggregate)
	inner := hd.Func
	hd.Func = func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		seen = ev
		return inner(ctx, tx, ev)
	}
	h := NewHandlerHarness(t, s.Pool, testRegistry(t), hd)
	require.Equal(t, Applied, h.DeliverMessage(ctx, w.Message(ctx)).Outcome)
	require.Equal(t, ev.MessageID, seen.MessageID)
	require.Equal(t, "req-8", seen.CorrelationID)
	require.WithinDuration(t, ev.OccurredAt, seen.OccurredAt, time.Microsecond, "as PostgreSQL keeps it")
	require.Equal(t, balance{Amount: 8, Applied: []string{"1"}}, readBalance(t, s.Pool, "acc-8"))
}
