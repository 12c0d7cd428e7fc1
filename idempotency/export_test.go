package idempotency

// Queued reports how many messages wait for the consumer's running batch.
func (c *Consumer) Queued() int {
	c.batch.mu.Lock()
	defer c.batch.mu.Unlock()
	return len(c.batch.queue)
}

// ListDeadLettersSQL is ListDeadLetters' query, for the test of its plan.
var ListDeadLettersSQL = listDeadLettersSQL

// DeadLetterCountsSQL is ReadDeadLetterCounts' query, for the test of its plan.
const DeadLetterCountsSQL = qDeadLetterCounts

// Rounds reports how many retry rounds the consumer has run.
func (c *Consumer) Rounds() int64 { return c.rounds.Load() }
