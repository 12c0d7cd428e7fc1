package idempotency_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The middleware's cost per message against the same handler without it:
// both commit one transaction that credits a balance; the middleware adds
// its one bookkeeping statement.
func BenchmarkHandler(b *testing.B) {
	s := outflowtest.NewSchema(b)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `CREATE TABLE balances (account text PRIMARY KEY, total bigint NOT NULL, applied bigint[] NOT NULL)`)
	if err != nil {
		b.Fatal(err)
	}
	credit := func(ctx context.Context, tx pgx.Tx, account string) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances (account, total, applied) VALUES ($1, 10, '{}')
			ON CONFLICT (account) DO UPDATE SET total = balances.total + 10`, account)
		return err
	}
	b.Run("without middleware", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return credit(ctx, tx, "plain") }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("with middleware", func(b *testing.B) {
		c, err := idempotency.NewConsumer(idempotency.Config{Pool: s.Pool, Consumer: "bench-" + b.Name()[len(b.Name())-1:],
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		h := c.Middleware(func(m *message.Message) ([]*message.Message, error) {
			tx, _ := idempotency.Tx(m.Context())
			return nil, credit(m.Context(), tx, "mw")
		})
		i := 0
		for b.Loop() {
			m := msgFor(b, "acct-"+string(rune('a'+i%20)), int64(i/20+1))
			if _, err := h(m); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
