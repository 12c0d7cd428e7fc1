package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestThousands(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0"}, {7, "7"}, {999, "999"}, {1000, "1,000"}, {12345, "12,345"},
		{1234567, "1,234,567"}, {-1234, "-1,234"}, {100000000, "100,000,000"},
	} {
		require.Equal(t, tc.want, thousands(tc.n), "%d", tc.n)
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		seconds float64
		want    string
	}{
		{0, "0 s"}, {-3, "0 s"}, {0.85, "850 ms"}, {4.24, "4.2 s"}, {42.9, "42 s"},
		{200, "3 min 20 s"}, {7200, "2 h"}, {7500, "2 h 5 min"}, {3*86400 + 4*3600, "3 d 4 h"},
	} {
		require.Equal(t, tc.want, duration(tc.seconds), "%v", tc.seconds)
	}
}

func TestRelative(t *testing.T) {
	now := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		t    time.Time
		want string
	}{
		{now, "just now"},
		{now.Add(-42 * time.Second), "42 s ago"},
		{now.Add(-3*time.Minute - 10*time.Second), "3 min ago"},
		{now.Add(-2 * time.Hour), "2 h ago"},
		{now.Add(20 * time.Second), "in 20 s"},
		{now.Add(-50 * time.Hour), "2 d 2 h ago"},
	} {
		require.Equal(t, tc.want, relative(tc.t, now))
	}
}

func TestTimeHTMLStatesItsZone(t *testing.T) {
	now := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	at := time.Date(2026, 12, 5, 4, 59, 30, 123456000, time.FixedZone("BRT", -3*3600)) // 07:59:30 UTC
	got := string(timeHTML(at, now.Add(5*time.Hour)))
	require.Contains(t, got, `>2026-12-05 07:59:30 UTC</time>`)
	require.Contains(t, got, `datetime="2026-12-05T07:59:30.123456Z"`)
	require.Contains(t, got, `(29 s ago)`)
	require.Empty(t, timeHTML(time.Time{}, now))
}
