package httpapi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLimiters(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLimiters(RateLimit{PerSecond: 2, Burst: 3}, func() time.Time { return now })
	for i := range 3 {
		ok, _ := l.allow("a")
		require.True(t, ok, "request %d of the burst", i)
	}
	ok, wait := l.allow("a")
	require.False(t, ok, "the burst is spent")
	require.Equal(t, 500*time.Millisecond, wait, "one token every 1/2 s")
	ok, wait = l.allow("a")
	require.False(t, ok)
	require.Equal(t, 500*time.Millisecond, wait, "a rejected request takes no token")

	ok, _ = l.allow("b")
	require.True(t, ok, "another key has its own bucket")

	now = now.Add(500 * time.Millisecond)
	ok, _ = l.allow("a")
	require.True(t, ok, "refilled")
	ok, _ = l.allow("a")
	require.False(t, ok)

	// Idle buckets are dropped once full again, and nothing is lost by it.
	now = now.Add(2 * time.Minute)
	ok, _ = l.allow("c")
	require.True(t, ok)
	require.Len(t, l.buckets, 1, "a and b were idle and full: swept")
	for range 3 {
		ok, _ = l.allow("a")
		require.True(t, ok)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		wait time.Duration
		want string
	}{
		{0, "1"},
		{time.Millisecond, "1"},
		{time.Second, "1"},
		{1001 * time.Millisecond, "2"},
		{90 * time.Second, "90"},
	} {
		require.Equal(t, tt.want, retryAfter(tt.wait), "%s", tt.wait)
	}
}

func TestRateLimitValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		r  RateLimit
		ok bool
	}{
		{RateLimit{}, true},
		{DefaultRateLimit, true},
		{RateLimit{PerSecond: 0.5, Burst: 1}, true},
		{RateLimit{PerSecond: 1}, false},
		{RateLimit{PerSecond: -1, Burst: 1}, false},
		{RateLimit{Burst: -1}, false},
	} {
		require.Equal(t, tt.ok, tt.r.validate() == nil, "%+v", tt.r)
	}
}
