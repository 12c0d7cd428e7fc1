package backoff

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	tests := []struct {
		attempt  int
		min, max time.Duration
	}{
		{1, 500 * time.Millisecond, time.Second},
		{2, time.Second, 2 * time.Second},
		{4, 4 * time.Second, 8 * time.Second},
		{20, 150 * time.Second, 300 * time.Second},  // capped
		{100, 150 * time.Second, 300 * time.Second}, // no overflow
	}
	for _, tt := range tests {
		for range 100 {
			d := Delay(time.Second, 5*time.Minute, tt.attempt)
			if d < tt.min || d > tt.max {
				t.Fatalf("attempt %d: %s outside [%s, %s]", tt.attempt, d, tt.min, tt.max)
			}
		}
	}
}
