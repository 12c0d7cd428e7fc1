// Package idempotency makes a Watermill handler safe on an at-least-once,
// possibly reordered stream: a duplicate delivery changes nothing, and each
// aggregate's events are applied in version order.
//
// # Usage
//
// Most services get it through package consumer, whose Worker gives each
// Handler a [Consumer]. On a Watermill router of your own, wrap the handler
// with a Consumer's [Consumer.Middleware], write the handler's effects in
// the transaction [Tx] returns, and run [Consumer.Run] beside the router
// for retries and held events:
//
//	c, err := idempotency.NewConsumer(idempotency.Config{Pool: pool, Consumer: "sync-analytics"})
//	if err != nil {
//		return err
//	}
//	h := router.AddConsumerHandler("sync-analytics", "payments", sub, func(msg *message.Message) error {
//		tx, _ := idempotency.Tx(msg.Context())
//		_, err := tx.Exec(msg.Context(), `UPDATE totals SET n = n + 1 WHERE id = 1`)
//		return err
//	})
//	h.AddMiddleware(c.Middleware)
//	go c.Run(ctx)
//
// The messages must carry the envelope the forwarder puts in their
// metadata (message id, aggregate type, id and version): see package
// events.
//
// What a handler gets:
//
//   - A duplicate, whenever it comes, is acknowledged with no effect: the
//     consumer's only bookkeeping is the last version it applied per
//     aggregate (consumer_aggregate_versions), updated in the handler's own
//     transaction, which commits before the message is acknowledged.
//   - A handler that fails rolls its effects back; the message is retried
//     with backoff (Config.MaxAttempts, Config.RetryBackoff), then marked
//     dead for an operator (`outflow dlq`, [ListDeadLetters]); its
//     aggregate's later events wait behind it, for this consumer only. A
//     payload of a schema version newer than the consumer knows
//     (events.ErrUnknownVersion) is retried past MaxAttempts and never
//     marked dead: it waits for the consumer's deployment.
//   - Strict ordering (the default): version N applies only after N-1; one
//     that arrives early is held and applied as soon as its predecessor is,
//     or marked dead after Config.GapTimeout. [LatestWins] applies any newer
//     version and skips older ones.
//   - Effects outside the database (an HTTP call) must not run inside the
//     transaction: see the NotifyMerchant handler for the pattern.
//   - [Retention] keeps the bookkeeping bounded, without deleting what
//     skips a redelivery.
//
// Every case (crashes, discard markers, consumers added late, reset
// aggregates), what the bookkeeping costs and the metrics are described in
// docs/idempotency.md.
package idempotency
