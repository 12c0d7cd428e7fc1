package handlers_test

import (
	"context"
	"os"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/redis" // the backend this service links
	"github.com/outflow-dev/outflow/events"
)

// A consumer is a name, a topic and a function of the payload type it
// wants, which writes its effects in the transaction it is given.
func ExampleWorker_Add() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	registry := events.NewRegistry()
	if err := paymentevents.Register(registry); err != nil {
		panic(err)
	}
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: os.Getenv("REDIS_URL")}})
	if err != nil {
		panic(err)
	}
	defer backend.Close()
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: registry})
	if err != nil {
		panic(err)
	}
	err = w.Add(consumer.On("loyalty-points", "payments",
		func(ctx context.Context, tx pgx.Tx, ev events.Event, paid paymentevents.Paid) error {
			_, err := tx.Exec(ctx, `UPDATE loyalty SET points = points + $2 WHERE merchant_id = $1`, paid.MerchantID, paid.Amount/100)
			return err
		}))
	if err != nil {
		panic(err)
	}
	_ = w.Run(ctx) // until ctx is done
}
