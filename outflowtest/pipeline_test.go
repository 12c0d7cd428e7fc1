package outflowtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/idempotency"
)

func TestPipelineDeliversInOrderOnce(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	// account.closed passes the handler unseen: its version still counts.
	p := StartPipeline(t, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler(ledgerAggregate)},
		AllowUnhandled(closed{}.EventType()))

	writeEvents(t, s.Pool,
		newEvent(t, "acc-p1", 1, credited{Account: "acc-p1", Amount: 1}),
		newEvent(t, "acc-p1", 2, credited{Account: "acc-p1", Amount: 2}))
	writeEvents(t, s.Pool, newEvent(t, "acc-p1", 3, closed{Account: "acc-p1"}))
	p.WaitHandled()
	require.Equal(t, balance{Amount: 3, Applied: []string{"1", "2"}}, readBalance(t, s.Pool, "acc-p1"))
}

func TestPipelineCommitWhileForwarderDown(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	p := StartPipeline(t, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler(ledgerAggregate)})

	p.StopForwarder()
	ev := newEvent(t, "acc-p2", 1, credited{Account: "acc-p2", Amount: 5})
	writeEvents(t, s.Pool, ev)
	RequireEvent(context.Background(), t, s.Pool, Want{Type: "account.credited", AggregateID: "acc-p2"})
	require.Equal(t, balance{}, readBalance(t, s.Pool, "acc-p2"))
	p.StartForwarder()
	p.WaitHandled()
	require.Equal(t, balance{Amount: 5, Applied: []string{"1"}}, readBalance(t, s.Pool, "acc-p2"))
	require.Equal(t, 1, p.Published(ev.MessageID))
}

func TestPipelineCrashBeforePublish(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	p := StartPipeline(t, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler(ledgerAggregate)})

	p.CrashBeforePublish(2)
	ev := newEvent(t, "acc-p3", 1, credited{Account: "acc-p3", Amount: 5})
	writeEvents(t, s.Pool, ev)
	p.WaitHandled()
	require.Zero(t, p.PendingCrashes())
	require.Equal(t, 2, p.ForwarderRestarts())
	require.Equal(t, 1, p.Published(ev.MessageID))
	require.Equal(t, balance{Amount: 5, Applied: []string{"1"}}, readBalance(t, s.Pool, "acc-p3"))
}

func TestPipelineCrashAfterPublishIsDeduplicated(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	p := StartPipeline(t, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler(ledgerAggregate)})

	p.CrashAfterPublish(1)
	v1 := newEvent(t, "acc-p4", 1, credited{Account: "acc-p4", Amount: 5})
	v2 := newEvent(t, "acc-p4", 2, credited{Account: "acc-p4", Amount: 6})
	writeEvents(t, s.Pool, v1, v2)
	p.WaitHandled()
	require.Equal(t, 1, p.ForwarderRestarts())
	require.Equal(t, 2, p.Published(v1.MessageID), "the broker got v1 twice")
	require.Equal(t, balance{Amount: 11, Applied: []string{"1", "2"}}, readBalance(t, s.Pool, "acc-p4"), "applied once each")
}

func TestPipelineCrashInHandler(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	hd := balanceHandler(ledgerAggregate)
	leaky := leakyHandler(s.Pool, ledgerAggregate)
	p := StartPipeline(t, s.Pool, testRegistry(t), []consumer.Handler{hd, leaky})

	p.CrashInHandler(hd.Name, 1)
	p.CrashInHandler(leaky.Name, 1)
	writeEvents(t, s.Pool, newEvent(t, "acc-p5", 1, credited{Account: "acc-p5", Amount: 5}))
	p.WaitHandled()
	require.Zero(t, p.PendingCrashes())
	require.Equal(t, balance{Amount: 5, Applied: []string{"1"}}, readBalance(t, s.Pool, "acc-p5"),
		"the handler writing in its transaction applied once")
	require.Equal(t, 2, countSideEffects(t, s.Pool),
		"the handler writing outside its transaction repeated its effect: the crash exposes it")
}

func TestWaitHandledFailsOnDeadMessages(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	broken := consumer.Handler{Name: "broken", Topic: ledgerAggregate,
		Func: func(context.Context, pgx.Tx, events.Event) error { return errors.New("always fails") }}
	p := StartPipeline(panicTB{t}, s.Pool, testRegistry(t), []consumer.Handler{broken},
		WithPipelineIdempotency(idempotency.Config{MaxAttempts: 1}))
	writeEvents(t, s.Pool, newEvent(t, "acc-p6", 1, credited{Account: "acc-p6", Amount: 1}))
	msg := panicMessage(func() { p.WaitHandled() })
	require.Contains(t, msg, "dead for handler broken: handler failed always fails")
}

func TestWaitHandledFailsWhileTheForwarderIsStopped(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	p := StartPipeline(panicTB{t}, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler(ledgerAggregate)})
	p.StopForwarder()
	writeEvents(t, s.Pool, newEvent(t, "acc-p7", 1, credited{Account: "acc-p7", Amount: 1}))
	msg := panicMessage(func() { p.WaitHandled() })
	require.Contains(t, msg, "1 outbox rows wait and the forwarder is stopped")
}

// Rows no handler takes fail WaitHandled, naming their topic and type,
// instead of passing it: a handler's wrong Topic or EventTypes would.
func TestWaitHandledFailsOnRowsNoHandlerTakes(t *testing.T) {
	t.Parallel()
	t.Run("a topic no handler reads", func(t *testing.T) {
		t.Parallel()
		s := kitSchema(t)
		p := StartPipeline(panicTB{t}, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler("acount")})
		writeEvents(t, s.Pool, newEvent(t, "acc-p8", 1, credited{Account: "acc-p8", Amount: 1}))
		msg := panicMessage(func() { p.WaitHandled() })
		require.Contains(t, msg, `1 outbox rows of account.credited on topic "account", which no handler reads (the handlers read: acount)`)
	})
	t.Run("a type no handler of the topic lists", func(t *testing.T) {
		t.Parallel()
		s := kitSchema(t)
		p := StartPipeline(panicTB{t}, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler(ledgerAggregate)})
		writeEvents(t, s.Pool, newEvent(t, "acc-p9", 1, credited{Account: "acc-p9", Amount: 1}),
			newEvent(t, "acc-p9", 2, closed{Account: "acc-p9"}))
		msg := panicMessage(func() { p.WaitHandled() })
		require.Contains(t, msg, `1 outbox rows of account.closed on topic "account", a type no handler of the topic lists (balances;`)
	})
}

// Given the writer's routes, StartPipeline refuses a handler on a topic
// they send none of its events to.
func TestStartPipelineChecksRoutes(t *testing.T) {
	t.Parallel()
	s := kitSchema(t)
	msg := panicMessage(func() {
		StartPipeline(panicTB{t}, s.Pool, testRegistry(t), []consumer.Handler{balanceHandler(ledgerAggregate)},
			WithRoutes(outbox.Routes{"*": "ledger"}))
	})
	require.Contains(t, msg, `handler "balances" reads topic "account", lists event type "account.credited"`)
	require.Contains(t, msg, `it is routed to "ledger"`)
}

func panicMessage(f func()) (msg string) {
	defer func() { msg = fmt.Sprint(recover()) }()
	f()
	return ""
}
