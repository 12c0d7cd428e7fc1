package fanout_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/sql" // the backend this service links
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/webhooks/fanout"
)

// A service sends its payments' events to its merchants' endpoints: the
// handler records them in the consumer's transaction, and wakes the
// sender (here a stand-in for the sender's Wake) once they are committed.
func ExampleHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.SQL,
		SQL: brokers.SQLConfig{DatabaseURL: os.Getenv("DATABASE_URL")}})
	if err != nil {
		panic(err)
	}
	defer backend.Close()
	reg := events.NewRegistry()
	if err := reg.Register(paid{}); err != nil {
		panic(err)
	}
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg})
	if err != nil {
		panic(err)
	}

	wake := make(chan struct{}, 1) // the sender's
	h := fanout.Handler("merchant-webhooks", "payment", fanout.Config{
		Account: func(ctx context.Context, tx pgx.Tx, ev events.Event) (string, error) {
			// The payload names the account; a service whose events do
			// not looks it up in tx, and returns an error for one it
			// does not know (the event is retried, then dead-lettered).
			return ev.Payload.(paid).Account, nil
		},
		Wake: func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		},
	}, paid{}.EventType())
	if err := w.Add(h); err != nil {
		fmt.Println(err)
		return
	}
	_ = w.Run(ctx)
}
