package cli

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/redact"
)

// readyTimeout bounds one /readyz: every check runs at once under it, so a
// probe with a timeout of a second or more always gets an answer.
const readyTimeout = 800 * time.Millisecond

// errUnknown marks a check that cannot tell (a broker with no Ping): it
// does not make the process unready.
var errUnknown = errors.New("unknown: this broker backend cannot be pinged")

// readiness holds the checks of /readyz. The roles of a process add theirs
// as they are built, after the metrics listener is up.
type readiness struct {
	mu     sync.Mutex
	checks map[string]func(context.Context) error
	redact func(string) string
	// started is set once every role of the process is built: until then
	// the checks are not all there, and the process is not ready.
	started atomic.Bool
}

// newReadiness returns the checks of a process, whose errors are shown
// with the configured connection strings redacted.
func (e *env) newReadiness() *readiness {
	return &readiness{checks: map[string]func(context.Context) error{}, redact: func(s string) string {
		return redact.Text(s, e.flags.ConnectionStrings()...)
	}}
}

// add adds a check; one name checked by two roles (the database) is
// checked once.
func (r *readiness) add(name string, check func(context.Context) error) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks[name] = check
}

func (r *readiness) addDatabase(pool *pgxpool.Pool) {
	r.add("database", pool.Ping)
}

// markStarted says every role is built: the checks are all there.
func (r *readiness) markStarted() {
	if r != nil {
		r.started.Store(true)
	}
}

// addBroker checks a backend that can be pinged (every built-in one); a
// backend of one's own that cannot is reported unknown.
func (r *readiness) addBroker(b brokers.Backend) {
	p, ok := b.(brokers.Pinger)
	if !ok {
		r.add("broker", func(context.Context) error { return errUnknown })
		return
	}
	r.add("broker", p.Ping)
}

// readyReport is /readyz's body: ready, the names of the failing checks,
// and each check's state ("ok", "unknown: ...", or its error).
type readyReport struct {
	Ready    bool              `json:"ready"`
	NotReady []string          `json:"not_ready"`
	Checks   map[string]string `json:"checks"`
}

func (r *readiness) report(ctx context.Context) readyReport {
	r.mu.Lock()
	checks := make(map[string]func(context.Context) error, len(r.checks))
	for k, v := range r.checks {
		checks[k] = v
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(checks))
	for name, check := range checks {
		go func() { results <- result{name, check(ctx)} }()
	}
	rep := readyReport{Ready: true, NotReady: []string{}, Checks: map[string]string{}}
	if !r.started.Load() {
		rep.Ready = false
		rep.NotReady = append(rep.NotReady, "started")
		rep.Checks["started"] = "starting: the roles are still being built"
	}
	for range checks {
		res := <-results
		switch {
		case res.err == nil:
			rep.Checks[res.name] = "ok"
		case errors.Is(res.err, errUnknown):
			rep.Checks[res.name] = res.err.Error()
		default:
			rep.Ready = false
			rep.NotReady = append(rep.NotReady, res.name)
			rep.Checks[res.name] = r.redact(res.err.Error())
		}
	}
	slices.Sort(rep.NotReady)
	return rep
}

// ServeHTTP answers 200 when every check passes, else 503; the JSON body
// names what is not ready.
func (r *readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rep := r.report(req.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !rep.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(rep)
}
