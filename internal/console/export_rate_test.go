package console

import "time"

// SetClock makes c's published rate read now instead of time.Now; call it
// before Run.
func SetClock(c *Console, now func() time.Time) { c.now = now }

// RateSamples is how many samples c's published rate holds.
func RateSamples(c *Console) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.rates.samples)
}
