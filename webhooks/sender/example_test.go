package sender_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

// A service runs one Sender per process next to its consumer, and calls
// Wake after a transaction that enqueued messages commits.
func ExampleNew() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	key, err := secretseal.ParseKey(os.Getenv(secretseal.KeyEnv))
	if err != nil {
		log.Fatal(err)
	}
	s := sender.New(pool, sender.Config{
		SecretKey:    key,
		DisableAfter: 3 * 24 * time.Hour, // shorter than the default 5 days
	})
	go func() {
		if err := s.Run(ctx); err != nil {
			log.Fatal(err)
		}
	}()
	// ... the consumer's handler calls fanout.Enqueue in its transaction,
	// and s.Wake() once it committed.
}
