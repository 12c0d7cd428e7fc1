package console

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoginThrottle(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b := []string{"addr:a"}, []string{"addr:b"}
	for _, tc := range []struct {
		name   string
		steps  func(l *loginThrottle)
		at     time.Duration // when wait is asked, after t0
		keys   []string
		lo, hi time.Duration // wait's bounds
	}{
		{"four failures cost nothing", func(l *loginThrottle) { failN(l, t0, a, 4) }, 0, a, 0, 0},
		{"the fifth refuses for 1-2 s", func(l *loginThrottle) { failN(l, t0, a, 5) }, 0, a, time.Second, 2 * time.Second},
		{"over once the delay is", func(l *loginThrottle) { failN(l, t0, a, 5) }, 2 * time.Second, a, 0, 0},
		{"the sixth doubles it", func(l *loginThrottle) { failN(l, t0, a, 6) }, 0, a, 2 * time.Second, 4 * time.Second},
		{"capped", func(l *loginThrottle) { failN(l, t0, a, 40) }, 0, a, loginLockMax / 2, loginLockMax},
		{"another key is not refused", func(l *loginThrottle) { failN(l, t0, a, 9) }, 0, b, 0, 0},
		{"either key refuses", func(l *loginThrottle) { failN(l, t0, a, 6) }, 0, []string{"addr:b", "addr:a"}, 2 * time.Second, 4 * time.Second},
		{"a success resets", func(l *loginThrottle) { failN(l, t0, a, 9); l.reset(a); failN(l, t0, a, 4) }, 0, a, 0, 0},
		{"forgotten an hour after the last failure", func(l *loginThrottle) {
			failN(l, t0, a, 4)
			l.fail(t0.Add(loginForget+2*time.Minute), b) // sweeps
		}, loginForget + 2*time.Minute, a, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLoginThrottle()
			tc.steps(l)
			wait := l.wait(t0.Add(tc.at), tc.keys)
			require.GreaterOrEqual(t, wait, tc.lo)
			require.LessOrEqual(t, wait, tc.hi)
			if tc.name == "forgotten an hour after the last failure" {
				failN(l, t0.Add(tc.at), a, 1)
				require.Equal(t, 1, l.entries["addr:a"].n, "counted afresh")
			}
		})
	}
}

func failN(l *loginThrottle, at time.Time, keys []string, n int) {
	for range n {
		l.fail(at, keys)
	}
}

func TestLoginThrottleIsBounded(t *testing.T) {
	t.Parallel()
	l := newLoginThrottle()
	t0 := time.Now()
	l.fail(t0, []string{"addr:first"})
	for i := range maxLoginEntries + 10 {
		l.fail(t0.Add(time.Duration(i+1)*time.Millisecond), []string{"key:" + string(rune('a'+i%26)) + time.Duration(i).String()})
	}
	require.LessOrEqual(t, len(l.entries), maxLoginEntries)
	require.NotContains(t, l.entries, "addr:first", "the oldest is forgotten first")
}

func TestLoginKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		remote, secret string
		want           []string
	}{
		{"127.0.0.1:5555", "ofk_abcdefgh-the-rest", []string{"addr:127.0.0.1", "key:ofk_abcdefgh"}},
		{"[::1]:5555", "ofk_abcdefgh", []string{"addr:::1", "key:ofk_abcdefgh"}},
		{"127.0.0.1:5555", "ofk_short", []string{"addr:127.0.0.1"}},
		{"127.0.0.1:5555", "not a key at all", []string{"addr:127.0.0.1"}},
		{"pipe", "", []string{"addr:pipe"}},
	} {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = tc.remote
		require.Equal(t, tc.want, loginKeys(r, tc.secret), "%s %s", tc.remote, tc.secret)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for wait, want := range map[time.Duration]string{
		0: "1", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", 90 * time.Second: "90",
	} {
		require.Equal(t, want, retryAfter(wait), "%s", wait)
	}
}
