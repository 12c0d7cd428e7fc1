package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/healthrules"
)

// The history keeps the last hour, in time order, and never more than
// maxHistory samples, however often it is given one.
func TestHistoryIsBounded(t *testing.T) {
	var h healthState
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) sample { return sample{snap: healthrules.Snapshot{At: t0.Add(d)}} }
	for i := range 3 * 3600 {
		h.add(at(time.Duration(i) * time.Second))
		h.add(at(time.Duration(i)*time.Second + 10*time.Millisecond)) // too close: dropped
		require.LessOrEqual(t, len(h.history), maxHistory)
	}
	newest := t0.Add(3*3600*time.Second - time.Second)
	require.Equal(t, newest, h.history[len(h.history)-1].snap.At)
	require.False(t, h.history[0].snap.At.Before(newest.Add(-historyWindow)), "nothing older than the hour")
	h.add(at(time.Hour)) // older than the newest: dropped
	require.Equal(t, newest, h.history[len(h.history)-1].snap.At)
}

// A rate of thousands reads with separators; a small one to a tenth.
func TestRateText(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &Console{rates: rateRing{window: time.Minute}}
	require.Equal(t, "n/a", c.rate(0, t0))
	require.Equal(t, "12,345/s", c.rate(123_450, t0.Add(10*time.Second)))
	require.Equal(t, "6,174/s", c.rate(123_475, t0.Add(20*time.Second))) // over the window's two intervals: 123,475 in 20 s
	small := &Console{rates: rateRing{window: time.Minute}}
	small.rate(0, t0)
	require.Equal(t, "2.5/s", small.rate(25, t0.Add(10*time.Second)))
}
