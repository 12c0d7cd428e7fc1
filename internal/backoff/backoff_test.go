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

func TestReconnect(t *testing.T) {
	for attempt, want := range map[int][2]time.Duration{
		1:  {ReconnectBase / 2, ReconnectBase},
		3:  {2 * ReconnectBase, 4 * ReconnectBase},
		50: {ReconnectMax / 2, ReconnectMax},
	} {
		for range 100 {
			if d := Reconnect(attempt); d < want[0] || d > want[1] {
				t.Fatalf("attempt %d: %s outside [%s, %s]", attempt, d, want[0], want[1])
			}
		}
	}
}
