// Package consumer runs a service's event handlers: a [Worker] subscribes
// each [Handler] to its topic with a consumer group of its own and wraps it
// in the idempotency middleware, so a handler is a plain function that gets
// the decoded event and the transaction to write its effects in.
//
//	w.Add(consumer.Handler{
//		Name:       "sync-analytics",
//		Topic:      "payments",
//		EventTypes: []string{"payment.paid", "payment.refunded"},
//		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error { ... },
//	})
//
// Per message, in this order: the router's recoverer turns a panic into an
// error; the idempotency middleware opens the transaction, records the
// message and checks its version; the handler runs (events of types it does
// not list still advance the aggregate's version, unseen by it); the
// transaction commits; the message is acknowledged. A failure parks the
// message in dead_letters for retries (see package idempotency), so the
// stream keeps flowing.
//
// A handler's Committed callback runs after its message's transaction
// committed: the place to wake in-process work that reads what it wrote.
//
// This package is framework: it imports no application code. The reference
// payments service's handlers live in package handlers.
package consumer
