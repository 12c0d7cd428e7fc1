package console

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestRateOver(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(sec int, total int64) rateSample {
		return rateSample{total: total, at: t0.Add(time.Duration(sec) * time.Second)}
	}
	for _, tc := range []struct {
		name    string
		samples []rateSample
		now     rateSample
		want    float64
		ok      bool
	}{
		{name: "no sample: the first read", now: at(0, 100)},
		{name: "the same instant", samples: []rateSample{at(0, 100)}, now: at(0, 150)},
		{name: "one interval", samples: []rateSample{at(0, 100)}, now: at(10, 150), want: 5, ok: true},
		{name: "nothing published", samples: []rateSample{at(0, 100), at(5, 100)}, now: at(10, 100), want: 0, ok: true},
		{name: "over the whole ring", samples: []rateSample{at(0, 0), at(5, 10), at(10, 40)}, now: at(20, 60), want: 3, ok: true},
		// A repartition or a reset counter: the total goes down. That
		// interval's events are unknown: it counts neither events nor time.
		{name: "a reset between samples", samples: []rateSample{at(0, 1000), at(10, 1100), at(15, 40)}, now: at(25, 90),
			want: float64(100+50) / 20, ok: true},
		{name: "a reset at the read", samples: []rateSample{at(0, 1000), at(10, 1100)}, now: at(20, 5), want: 10, ok: true},
		{name: "only a reset", samples: []rateSample{at(0, 1000)}, now: at(10, 5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rateOver(tc.samples, tc.now)
			require.Equal(t, tc.ok, ok)
			require.InDelta(t, tc.want, got, 1e-9)
			require.GreaterOrEqual(t, got, 0.0)
		})
	}
}

// The ring keeps the last window (and always its newest sample), and a
// sample at most every rateMinGap.
func TestRateRing(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := rateRing{window: 10 * time.Second}
	add := func(ms int, total int64) {
		r.add(rateSample{total: total, at: t0.Add(time.Duration(ms) * time.Millisecond)})
	}
	add(0, 1)
	add(300, 2) // too close: the live refresh of a second tab
	add(1000, 3)
	add(900, 4) // before the newest: out of order
	require.Equal(t, []int64{1, 3}, totals(r))
	add(10500, 5)
	require.Equal(t, []int64{3, 5}, totals(r), "the sample of 0s is out of the window")
	add(60000, 6)
	require.Equal(t, []int64{6}, totals(r), "the newest is kept")
}

func totals(r rateRing) []int64 {
	var out []int64
	for _, s := range r.samples {
		out = append(out, s.total)
	}
	return out
}

// The rate's settings are checked by New, which names the bad one.
func TestNewChecksTheRateSettings(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/never-dialled") // connects lazily
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, tc := range []struct {
		name  string
		cfg   Config
		names string
	}{
		{"negative interval", Config{RateSampleInterval: -time.Second}, "RateSampleInterval"},
		{"negative window", Config{RateWindow: -time.Second}, "RateWindow"},
		{"window shorter than the interval", Config{RateSampleInterval: 2 * time.Minute}, "RateWindow (1m0s) must not be shorter than RateSampleInterval (2m0s)"},
		{"every error at once", Config{RateSampleInterval: -time.Second, PageSize: -1}, "PageSize: must not be negative\nRateSampleInterval: must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Pool = pool
			_, err := New(tc.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, tc.names)
		})
	}
	c, err := New(Config{Pool: pool})
	require.NoError(t, err)
	require.Equal(t, DefaultRateSampleInterval, c.cfg.RateSampleInterval)
	require.Equal(t, DefaultRateWindow, c.rates.window)
}
