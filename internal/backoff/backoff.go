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
