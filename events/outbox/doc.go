// Package outbox is the write side of the transactional outbox: it publishes
// events as rows of the outbox table inside the caller's database
// transaction, so that an event exists if and only if the state change that
// caused it committed.
//
//	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "invoices"}})
//	...
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// ... change the invoice, on tx ...
//		return writer.WriteTx(ctx, tx, events.Aggregate{Type: "invoice", ID: id, Version: version},
//			InvoicePaid{InvoiceID: id, Amount: 1250})
//	})
//
// Rows are written by a Watermill SQL publisher (watermill-sql v4) bound to
// the caller's transaction, through [SchemaAdapter], which maps the event
// envelope onto the table's columns. The forwarder (package forwarder) later
// moves committed rows to the broker.
//
// There is deliberately no way to publish outside a transaction: [Writer]
// takes a pgx.Tx or a database/sql *sql.Tx, and a nil or finished
// transaction fails with [ErrNoTransaction] instead of auto-committing a lone
// event that no state change stands behind.
//
// A command writes its event with one call, [Writer.WriteTx] (the aggregate
// at its new version and the payload); [Writer.PublishTx] writes events
// built beforehand with events.New, several at once.
//
// An event larger than the broker takes is refused at write time, inside
// the transaction and before anything is written, with [ErrEventTooLarge]
// (an [*EventTooLargeError] naming its size and the limit): Config's
// MaxEventBytes, whose ceiling is the limit of Config.Broker, the broker
// the forwarder publishes to. The caller rolls back or writes a smaller
// event; see docs/events.md, "Limits".
//
// Topic routing is data: [Routes] maps event types to topics. Without
// Routes (Config.Routes nil) an event's topic is its aggregate type, so
// the handlers of a "payout" aggregate's events read the topic "payout".
// Pass the same Routes and the service's handlers to consumer.CheckRoutes
// at start-up to find a handler on a topic its events are not routed to.
package outbox
