// Package fanout records webhook messages: one per event an account's
// endpoints want, and one delivery per matching endpoint, in the caller's
// transaction (the consumer handler's, so a message is recorded exactly
// once per event). [Enqueue] is the one statement that does it; the
// consumer handler, the test events and the endpoint.disabled notices all
// go through it.
package fanout
