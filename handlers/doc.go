// Package handlers runs Outflow's consumers: a [Worker] subscribes each
// handler to its topic's Redis streams with a consumer group of its own and
// wraps it in the idempotency middleware, so a handler is a plain function
// that gets the decoded event and the transaction to write its effects in.
//
//	w.Add(handlers.Handler{
//		Name:       "sync-analytics",
//		Topic:      "payments",
//		EventTypes: []string{payment.PaidType, payment.RefundedType},
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
// Reference handlers: [SyncAnalytics] keeps a per-merchant projection.
package handlers
