package console

import (
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/internal/backoff"
)

// Failed logins are throttled per client address and per key prefix (the
// name a secret claims: the part `outflow apikey list` shows): from the
// loginFreeFailures-th failure of either on, each failure refuses its
// logins for a delay that doubles, from loginLockBase to loginLockMax
// (backoff.Delay, jittered), and a successful login clears both.
//
// This is a failure counter of its own rather than the API's token bucket
// (app/httpapi's limiters): a bucket counts every request, not failures,
// is not reset by a success, and refuses for a fixed time rather than a
// growing one. The delays themselves are internal/backoff's.
const (
	loginFreeFailures = 5
	loginLockBase     = 2 * time.Second
	loginLockMax      = 10 * time.Minute
	// loginForget is how long after its last failure an address or prefix
	// starts afresh.
	loginForget = time.Hour
	// maxLoginEntries bounds the memory: past it, the entry whose last
	// failure is oldest is forgotten first.
	maxLoginEntries = 10000
)

type loginFailures struct {
	n     int       // failures since the last success, or since forgotten
	until time.Time // logins refused until then
	last  time.Time // the last failure
}

// loginThrottle is in the process: with several console processes behind
// a balancer, each counts its own.
type loginThrottle struct {
	mu        sync.Mutex
	entries   map[string]*loginFailures
	lastSweep time.Time
}

func newLoginThrottle() *loginThrottle {
	return &loginThrottle{entries: map[string]*loginFailures{}}
}

// loginKeys are what a login attempt is counted against: the client's
// address as the console sees it (behind a reverse proxy, the proxy's:
// all its clients share it), and the prefix of the secret, when it is
// shaped like a key.
func loginKeys(r *http.Request, secret string) []string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	keys := []string{"addr:" + host}
	if p := apikey.PrefixOf(secret); p != "" {
		keys = append(keys, "key:"+p)
	}
	return keys
}

// wait is how long logins for keys are still refused at now; 0: allowed.
func (l *loginThrottle) wait(now time.Time, keys []string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var wait time.Duration
	for _, k := range keys {
		if f, ok := l.entries[k]; ok && f.until.After(now) {
			wait = max(wait, f.until.Sub(now))
		}
	}
	return wait
}

// fail counts a failed login against keys.
func (l *loginThrottle) fail(now time.Time, keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	for _, k := range keys {
		f, ok := l.entries[k]
		if !ok {
			if len(l.entries) >= maxLoginEntries {
				l.evictOldest()
			}
			f = &loginFailures{}
			l.entries[k] = f
		}
		f.n++
		f.last = now
		if f.n >= loginFreeFailures {
			f.until = now.Add(backoff.Delay(loginLockBase, loginLockMax, f.n-loginFreeFailures+1))
		}
	}
}

// reset forgets keys' failures: a successful login.
func (l *loginThrottle) reset(keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		delete(l.entries, k)
	}
}

// sweep forgets, once a minute, what is no longer refused and failed last
// more than loginForget ago.
func (l *loginThrottle) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < time.Minute {
		return
	}
	l.lastSweep = now
	for k, f := range l.entries {
		if !f.until.After(now) && now.Sub(f.last) > loginForget {
			delete(l.entries, k)
		}
	}
}

func (l *loginThrottle) evictOldest() {
	var oldest string
	var at time.Time
	for k, f := range l.entries {
		if oldest == "" || f.last.Before(at) {
			oldest, at = k, f.last
		}
	}
	delete(l.entries, oldest)
}

// retryAfter is a Retry-After value: whole seconds, rounded up, at least 1.
func retryAfter(wait time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(wait.Seconds()))), 10)
}
