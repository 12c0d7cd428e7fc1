package idempotency

import "context"

// RetryRound runs one round of what [Consumer.Run] does, now, in the
// caller's goroutine: every dead letter that is due (a failed one whose
// backoff has passed, a held one whose predecessor has been applied) is
// tried once. It returns how many it settled, so a caller that wants
// everything due applied calls it until it returns 0. It is for tests and
// tools that drive a consumer synchronously (package outflowtest); a
// service runs Run. The Middleware must have been applied first.
func (c *Consumer) RetryRound(ctx context.Context) (int, error) {
	return c.retryRound(ctx)
}
