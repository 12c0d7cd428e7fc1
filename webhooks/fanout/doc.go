// Package fanout records webhook messages: one per event an account's
// endpoints want, and one delivery per matching endpoint, in the caller's
// transaction (the consumer handler's, so a message is recorded exactly
// once per event). [Enqueue] is the one statement that does it; the
// consumer handler ([Handler]), the test events and the endpoint.disabled
// notices all go through it.
//
// The handler never calls an endpoint: HTTP inside the consumer's
// transaction would hold it open for as long as the slowest endpoint
// takes, and a rollback could not take a request back. It records the
// deliveries, and the sender (package webhooks/sender) makes the calls
// afterwards, outside any transaction; Config.Wake tells it at once.
//
// A service mounts it as any consumer handler, naming how an event's
// account is found:
//
//	h := fanout.Handler("webhooks", "payments", fanout.Config{
//		Account: func(ctx context.Context, tx pgx.Tx, ev events.Event) (string, error) {
//			return ev.Payload.(Paid).MerchantID, nil
//		},
//		Wake: snd.Wake,
//	}, "payment.paid", "payment.refunded")
//	err := worker.Add(h)
package fanout
