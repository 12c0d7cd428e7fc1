package sql

import (
	"testing"
	"time"
)

// A row held by an older open transaction is looked at again within a few
// milliseconds for as long as the streak is young, however many looks it
// took; only a long transaction makes the subscription back off, and then
// never past the idle poll or a second.
func TestHeldWait(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		held     int
		heldFor  time.Duration
		poll     time.Duration
		min, max time.Duration
	}{
		{"first look", 1, 0, 100 * time.Millisecond, 0, time.Millisecond},
		{"tenth look of a young streak", 10, 300 * time.Millisecond, 100 * time.Millisecond, heldStep / 2, heldStep},
		{"hundredth look of a young streak", 100, 900 * time.Millisecond, time.Hour, heldStep / 2, heldStep},
		{"a long transaction: back off to the poll", 400, 2 * time.Second, 100 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond},
		{"a long transaction: at most a second", 400, time.Minute, time.Hour, 500 * time.Millisecond, time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for range 50 { // jittered: every draw within bounds
				if d := heldWait(c.held, c.heldFor, c.poll); d < c.min || d > c.max {
					t.Fatalf("heldWait(%d, %v, %v) = %v, want within [%v, %v]", c.held, c.heldFor, c.poll, d, c.min, c.max)
				}
			}
		})
	}
}
