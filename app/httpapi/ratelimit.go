package httpapi

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is the token bucket each API key gets: PerSecond requests a
// second on average, in bursts of up to Burst. The zero value turns
// limiting off. The buckets live in the process: with N API instances
// behind a balancer a key gets up to N times the rate, which is the usual
// trade for not paying a shared store on every request.
type RateLimit struct {
	PerSecond float64
	Burst     int
}

// DefaultRateLimit is what `outflow serve` applies unless told otherwise:
// far above what an integration sends, low enough that one runaway client
// cannot take the database from the others.
var DefaultRateLimit = RateLimit{PerSecond: 50, Burst: 100}

func (r RateLimit) enabled() bool { return r.PerSecond > 0 }

func (r RateLimit) validate() error {
	switch {
	case r.PerSecond < 0 || math.IsNaN(r.PerSecond) || math.IsInf(r.PerSecond, 0):
		return fmt.Errorf("RateLimit.PerSecond: must be a finite number >= 0 (0: off)")
	case r.enabled() && r.Burst < 1:
		return fmt.Errorf("RateLimit.Burst: must be at least 1 when PerSecond is set")
	case r.Burst < 0:
		return fmt.Errorf("RateLimit.Burst: must not be negative")
	}
	return nil
}

// limiters holds one bucket per API key id.
type limiters struct {
	cfg RateLimit
	now func() time.Time

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time
}

func newLimiters(cfg RateLimit, now func() time.Time) *limiters {
	return &limiters{cfg: cfg, now: now, buckets: make(map[string]*bucket), lastSweep: now()}
}

// allow takes a token from key's bucket. When there is none it returns
// false and how long until there is one.
func (l *limiters) allow(key string) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{lim: rate.NewLimiter(rate.Limit(l.cfg.PerSecond), l.cfg.Burst)}
		l.buckets[key] = b
	}
	b.last = now
	if b.lim.AllowN(now, 1) {
		return true, 0
	}
	r := b.lim.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	r.CancelAt(now) // only asking: the rejected request takes no token
	return false, wait
}

// sweep drops, once a minute, the buckets idle long enough to have filled
// up again: a fresh bucket is the same, so nothing is forgotten, and the
// map does not keep every key ever seen (revoked ones included).
func (l *limiters) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < time.Minute {
		return
	}
	l.lastSweep = now
	refill := time.Duration(float64(l.cfg.Burst) / l.cfg.PerSecond * float64(time.Second))
	for k, b := range l.buckets {
		if now.Sub(b.last) > refill {
			delete(l.buckets, k)
		}
	}
}

// retryAfter is the Retry-After value for a wait: whole seconds, rounded
// up, at least 1 (the header has no finer unit, and 0 invites a retry
// storm).
func retryAfter(wait time.Duration) string {
	s := int64(math.Ceil(wait.Seconds()))
	if s < 1 {
		s = 1
	}
	return fmt.Sprint(s)
}
