// Package backoff computes retry delays: exponential with jitter, so that
// many failing items do not retry in step.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay returns the wait before retry number attempt (1 for the first):
// base doubled per attempt, capped at max, then drawn uniformly from its
// upper half.
func Delay(base, max time.Duration, attempt int) time.Duration {
	d := base << min(attempt-1, 30)
	if d <= 0 || d > max {
		d = max
	}
	return d/2 + rand.N(d/2+1)
}

// RetryBase and RetryMax are the default RetryBackoff and RetryBackoffMax
// of every Config that retries a failing item (an outbox row, a relayed
// message, a consumer's held or failed message, a legacy webhook): one
// schedule, so that an operator reads one set of numbers.
const (
	RetryBase = time.Second
	RetryMax  = 5 * time.Minute
)

// ReconnectBase and ReconnectMax bound the waits between tries to reach a
// broker or database that is unreachable (a subscriber's read, a LISTEN
// connection, a forwarder's batch during an outage): short enough that a
// restart is noticed within seconds, long enough not to hammer a server
// coming back.
const (
	ReconnectBase = 100 * time.Millisecond
	ReconnectMax  = 5 * time.Second
)

// Reconnect returns the wait before try number attempt (1 for the first)
// to reach an unreachable broker or database.
func Reconnect(attempt int) time.Duration {
	return Delay(ReconnectBase, ReconnectMax, attempt)
}
