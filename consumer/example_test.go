package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/redis" // the backend this service links
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/idempotency"
)

// The service's handlers run on its own Watermill router, with its own
// middleware around them (outside the idempotency middleware, so a
// timeout bounds the handler, never the commit), each handler with
// settings of its own.
func ExampleWorker_AddTo() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	registry := events.NewRegistry()
	if err := registry.Register(orderPlaced{}); err != nil {
		panic(err)
	}

	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: os.Getenv("REDIS_URL")}})
	if err != nil {
		panic(err)
	}
	defer backend.Close()

	w, err := consumer.NewWorker(consumer.WorkerConfig{
		Pool: pool, Broker: backend, Registry: registry,
		Middleware: []message.HandlerMiddleware{middleware.Timeout(10 * time.Second)},
	})
	if err != nil {
		panic(err)
	}
	h := consumer.On("fulfil-orders", "orders", func(ctx context.Context, tx pgx.Tx, ev events.Event, o orderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, o.OrderID)
		return err
	})
	h.BatchSize = 10                                   // this handler's own read size
	h.Idempotency = idempotency.Config{MaxAttempts: 3} // and its own retries
	if err := w.Add(h); err != nil {
		panic(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NewSlogLogger(nil))
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(middleware.Recoverer) // the service's own, for every handler
	stop, err := w.AddTo(ctx, router)
	if err != nil {
		panic(err)
	}
	defer stop() // after the router stopped
	if err := router.Run(ctx); err != nil {
		panic(err)
	}
}

// At start-up, check the handlers against the writer's routes and the
// registry: every mistake is reported at once, before any event is lost
// on a handler that would never be called.
func ExampleCheckRoutes() {
	registry := events.NewRegistry()
	if err := registry.Register(orderPlaced{}); err != nil {
		panic(err)
	}
	routes := outbox.Routes{"order.placed": "orders"} // the writer's outbox.Config.Routes
	ship := func(context.Context, pgx.Tx, events.Event, orderPlaced) error { return nil }
	err := consumer.CheckRoutes(routes, registry,
		consumer.On("ship-orders", "orders", ship),
		consumer.On("invoice-orders", "order", ship), // a typo in the topic
		consumer.Handler{Name: "count-orders", Topic: "orders", EventTypes: []string{"order.plcaed"}, // and in a type
			Func: func(context.Context, pgx.Tx, events.Event) error { return nil }},
	)
	fmt.Println(err)
	fmt.Println(errors.Is(err, consumer.ErrNotRouted), errors.Is(err, consumer.ErrUnknownEventType))
	// Output:
	// handler "invoice-orders" reads topic "order", lists event type "order.placed": no route sends these events to the handler's topic (it is routed to "orders")
	// handler "count-orders" lists event type "order.plcaed": event type not registered (registered: order.placed)
	// true true
}
