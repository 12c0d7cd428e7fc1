package walrelay

import (
	"testing"
	"time"
)

// The bodies' cutoff in WAL mode follows what the slot has confirmed: no
// purge until the WAL's end at an earlier run is confirmed; then at most a
// day before that run.
func TestRelayMarks(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	h := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Hour) }
	type step struct {
		now             time.Time
		walEnd, confirm int64
		want            time.Time // zero: none confirmed
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"caught up at once", []step{{h(0), 100, 100, h(0)}}},
		{"behind after an outage: nothing until a mark is confirmed", []step{
			{h(0), 1000, 10, time.Time{}},
			{h(1), 2000, 500, time.Time{}},
			{h(2), 3000, 1500, h(0)},
			{h(3), 3500, 3500, h(3)},
		}},
		{"the latest confirmed mark stays a floor", []step{
			{h(0), 100, 100, h(0)},
			{h(1), 900, 200, h(0)},
			{h(2), 950, 900, h(1)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m relayMarks
			for i, s := range tt.steps {
				got, ok := m.observe(s.now, s.walEnd, s.confirm)
				if ok != !s.want.IsZero() || !got.Equal(s.want) {
					t.Fatalf("step %d: got %v %v, want %v", i, got, ok, s.want)
				}
			}
		})
	}
}

func TestBodiesCutoff(t *testing.T) {
	now := time.Date(2026, 12, 20, 12, 0, 0, 0, time.UTC)
	retention := now.Add(-15 * 24 * time.Hour)
	for _, tt := range []struct {
		name    string
		relayed time.Time
		want    time.Time
	}{
		{"caught up: the retention's", now, retention},
		{"relayed only up to 18 days ago: a day before that", now.Add(-18 * 24 * time.Hour), now.Add(-19 * 24 * time.Hour)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := bodiesCutoff(retention, tt.relayed); !got.Equal(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}
