package sender_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

var quiet = slog.New(slog.DiscardHandler)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

type env struct {
	t *testing.T
	s *outflowtest.Schema
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return &env{t: t, s: outflowtest.NewSchema(t, schema.Set())}
}

// ep is an endpoint as a test inserts it, with plain SQL.
type ep struct {
	account, url, secret string
	prevSecret           string
	prevExpires          time.Time
	rateLimit            int
	failures             int
	disabled             bool
	apiVersion           string
}

func (e *env) endpoint(x ep) string {
	e.t.Helper()
	id := uuid.NewString()
	if x.secret == "" {
		x.secret = testSecret
	}
	if x.account == "" {
		x.account = "acct"
	}
	var prev *string
	var prevExp *time.Time
	if x.prevSecret != "" {
		prev, prevExp = &x.prevSecret, &x.prevExpires
	}
	var rl *int
	if x.rateLimit > 0 {
		rl = &x.rateLimit
	}
	var disAt *time.Time
	var disReason *string
	if x.disabled {
		now, r := time.Now(), "manual"
		disAt, disReason = &now, &r
	}
	var failingSince *time.Time
	if x.failures > 0 {
		now := time.Now()
		failingSince = &now
	}
	e.exec(`INSERT INTO webhook_endpoints (id, account_id, url, secret, previous_secret, previous_secret_expires_at,
		rate_limit, consecutive_failures, failing_since, disabled_at, disabled_reason, api_version)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		id, x.account, x.url, x.secret, prev, prevExp, rl, x.failures, failingSince, disAt, disReason, x.apiVersion)
	return id
}

func (e *env) exec(q string, args ...any) {
	e.t.Helper()
	if _, err := e.s.Pool.Exec(context.Background(), q, args...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) intQ(q string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.s.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// enqueue records n messages of type typ for account with fanout.Enqueue,
// as a service's handler would, and returns their ids.
func (e *env) enqueue(account, typ string, n int) []string {
	e.t.Helper()
	var ids []string
	for i := range n {
		id := uuid.NewString()
		payload, _ := json.Marshal(map[string]any{"n": i})
		if _, err := fanout.Enqueue(context.Background(), e.s.Pool, webhooks.Message{ID: id, AccountID: account,
			EventType: typ, OccurredAt: time.Now(), Payload: payload}, fanout.Target{}, ""); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// delivered counts the delivered deliveries of endpoint.
func (e *env) delivered(endpoint string) int {
	return e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'delivered'`, endpoint)
}

// fast is a Config for tests: private addresses allowed (the endpoints are
// httptest servers), short polls, timeouts and schedule, no jitter.
func fast(c sender.Config) sender.Config {
	c.AllowPrivate = true
	if c.PollInterval == 0 {
		c.PollInterval = 20 * time.Millisecond
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.LeaseMargin == 0 {
		c.LeaseMargin = time.Second
	}
	if c.Schedule == nil {
		c.Schedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}
	}
	if c.Jitter == 0 {
		c.Jitter = -1
	}
	if c.CircuitFailures == 0 {
		c.CircuitFailures = 1000
	}
	if c.Logger == nil {
		c.Logger = quiet
	}
	return c
}

// start runs a Sender until the test ends (or stop is called).
func (e *env) start(c sender.Config) (*sender.Sender, func()) {
	e.t.Helper()
	s := sender.New(e.s.Pool, c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				e.t.Errorf("Run did not return after its context ended")
			}
		})
	}
	e.t.Cleanup(stop)
	return s, stop
}

// request is one request a test server received.
type request struct {
	at     time.Time
	header http.Header
	body   []byte
}

// server is an endpoint: it records the requests and answers with handle
// (200 when nil).
type server struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []request
	handle func(w http.ResponseWriter, r *http.Request, n int) // n: the request's number, from 1
}

func newServer(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, n int)) *server {
	t.Helper()
	s := &server{handle: handle}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, request{at: time.Now(), header: r.Header.Clone(), body: body})
		n := len(s.reqs)
		s.mu.Unlock()
		if s.handle != nil {
			s.handle(w, r, n)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// slowBesideHealthy is an env with two endpoints: account "slow"'s
// answers nothing (newStuckServer; no failure yet, so not suspect when
// leased), account "ok"'s answers at once. It returns the stuck server and
// the healthy endpoint's id.
func slowBesideHealthy(t *testing.T) (*env, *server, string) {
	t.Helper()
	e := newEnv(t)
	slow := newStuckServer(t)
	healthy := newServer(t, nil)
	e.endpoint(ep{account: "slow", url: slow.URL})
	return e, slow, e.endpoint(ep{account: "ok", url: healthy.URL})
}

// newStuckServer is a receiver that answers no request: each waits until
// it is cancelled (the Sender shut down) or the test ends.
func newStuckServer(t *testing.T) *server {
	t.Helper()
	stuck := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { _ = blockUntil(stuck, r) })
	t.Cleanup(func() { close(stuck) }) // before the server's Close, which waits for its requests
	return s
}

func (s *server) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.reqs...)
}

// blockUntil makes a handler wait until ch closes or the request is
// cancelled (the Sender shut down).
func blockUntil(ch <-chan struct{}, r *http.Request) error {
	select {
	case <-ch:
		return nil
	case <-r.Context().Done():
		return errors.New("cancelled")
	}
}
