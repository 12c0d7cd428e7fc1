package outflowtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/idempotency"
)

// Test-local events: the kit is framework and knows no application's.

const ledgerAggregate = "account"

type credited struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
	Note    string `json:"note,omitempty"`
}

func (credited) EventType() string { return "account.credited" }

type closed struct {
	Account string `json:"account"`
}

func (closed) EventType() string { return "account.closed" }

func testRegistry(t testing.TB) *events.Registry {
	t.Helper()
	reg := events.NewRegistry()
	require.NoError(t, reg.Register(credited{}, closed{}))
	return reg
}

func newEvent(t testing.TB, id string, version int64, p events.Payload) events.Event {
	t.Helper()
	ev, err := events.New(context.Background(), events.Aggregate{Type: ledgerAggregate, ID: id, Version: version}, p)
	require.NoError(t, err)
	return ev
}

// kitSchema is a migrated schema plus the test handlers' table.
func kitSchema(t testing.TB) *Schema {
	t.Helper()
	s := NewSchema(t)
	_, err := s.Pool.Exec(context.Background(), `
		CREATE TABLE balances (account text PRIMARY KEY, amount bigint NOT NULL, applied text[] NOT NULL DEFAULT '{}');
		CREATE TABLE side_effects (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(t, err)
	return s
}

// balanceHandler is a correct handler: its effects go into tx, and it
// records the versions it applied, in order.
func balanceHandler(topic string) consumer.Handler {
	return consumer.Handler{
		Name:       "balances",
		Topic:      topic,
		EventTypes: []string{credited{}.EventType()},
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			c := ev.Payload.(credited)
			_, err := tx.Exec(ctx, `INSERT INTO balances (account, amount, applied) VALUES ($1, $2, ARRAY[$3])
				ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2, applied = balances.applied || $3`,
				c.Account, c.Amount, fmt.Sprint(ev.AggregateVersion))
			return err
		},
	}
}

// leakyHandler writes its effect through the pool, outside the
// transaction it was given: the bug the kit must catch.
func leakyHandler(pool *pgxpool.Pool, topic string) consumer.Handler {
	return consumer.Handler{
		Name:  "leaky",
		Topic: topic,
		Func: func(ctx context.Context, _ pgx.Tx, ev events.Event) error {
			c, ok := ev.Payload.(credited)
			if !ok {
				return nil
			}
			_, err := pool.Exec(ctx, `INSERT INTO side_effects (account, amount) VALUES ($1, $2)`, c.Account, c.Amount)
			return err
		},
	}
}

type balance struct {
	Amount  int64
	Applied []string
}

func readBalance(t testing.TB, pool *pgxpool.Pool, account string) balance {
	t.Helper()
	var b balance
	err := pool.QueryRow(context.Background(), `SELECT amount, applied FROM balances WHERE account = $1`, account).Scan(&b.Amount, &b.Applied)
	if err == pgx.ErrNoRows {
		return balance{}
	}
	require.NoError(t, err)
	return b
}

func countSideEffects(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM side_effects`).Scan(&n))
	return n
}

func writeEvents(t testing.TB, pool *pgxpool.Pool, evs ...events.Event) {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, evs...) }))
}

// recorder is a testingT that records failures instead of ending the test,
// so the kit's own tests can see its assertions fail. FailNow ends the
// goroutine, as testing's does; run assertions through fails.
type recorder struct {
	mu     sync.Mutex
	msgs   []string
	failed bool
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}
func (r *recorder) FailNow() {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	panic(failNow{})
}

type failNow struct{}

// fails runs f with a recorder and returns what it reported, "" when it
// passed.
func fails(f func(t testingT)) (msg string) {
	r := &recorder{}
	func() {
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(failNow); !ok {
					panic(p)
				}
			}
		}()
		f(r)
	}()
	if !r.failed {
		return ""
	}
	return strings.Join(r.msgs, "\n")
}

func idempotencyOne() idempotency.Config { return idempotency.Config{MaxBatch: 1} }

// panicTB turns Fatalf into a panic, to check misuse is refused.
type panicTB struct{ testing.TB }

func (p panicTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
