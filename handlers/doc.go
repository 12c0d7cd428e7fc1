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
// A handler's Committed callback runs after its message's transaction
// committed: the place to wake in-process work that reads what it wrote.
//
// Reference handlers: [SyncAnalytics] keeps a per-merchant projection;
// [NotifyMerchant] records a Standard Webhooks delivery per paid or refunded
// payment, which a [Sender] sends (concurrently, bounded per merchant, under
// fenced leases, redirects never followed; see its doc), woken through
// Committed. [PurgeWebhooks] removes settled deliveries after the
// retention.
package handlers
