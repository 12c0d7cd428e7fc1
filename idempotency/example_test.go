package idempotency_test

import (
	"context"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/idempotency"
)

// A handler on a Watermill router of the service's own: the Consumer's
// middleware makes it idempotent and ordered per aggregate, its effects go
// in the transaction the middleware opened, and Run retries what failed and
// applies what arrived early.
func ExampleConsumer_Middleware() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	var sub message.Subscriber // the broker's subscriber for this consumer group (see package brokers)

	c, err := idempotency.NewConsumer(idempotency.Config{Pool: pool, Consumer: "sync-analytics"})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	h := router.AddConsumerHandler("sync-analytics", "payments", sub, func(msg *message.Message) error {
		tx, _ := idempotency.Tx(msg.Context())
		_, err := tx.Exec(msg.Context(), `UPDATE totals SET events = events + 1 WHERE id = 1`)
		return err
	})
	h.AddMiddleware(c.Middleware)

	go func() {
		if err := c.Run(ctx); err != nil {
			panic(err)
		}
	}()
	if err := router.Run(ctx); err != nil {
		panic(err)
	}
}
