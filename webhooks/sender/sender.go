package sender

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/internal/redact"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

// UserAgent is the User-Agent of every webhook request.
const UserAgent = "Outflow-Webhooks/1"

// Sender delivers the deliveries [fanout.Enqueue] recorded. See the
// package documentation for what it guarantees.
type Sender struct {
	pool    *pgxpool.Pool
	cfg     Config
	cfgErr  error
	client  *http.Client
	wake    chan struct{}
	metrics *metrics // nil without Config.Registerer
	longest time.Duration

	mu       sync.Mutex
	inflight map[string]int           // requests in flight per endpoint id
	total    int                      // requests holding one of Concurrency's slots
	suspect  int                      // requests in the suspect lane (some of them in total too)
	slow     map[string]int           // endpoints with requests moved to the suspect lane (SlowAfter)
	running  map[*slot]struct{}       // the requests counted in total
	limits   map[string]*rate.Limiter // endpoints with a rate_limit, while their bucket is not full

	// settleHook, set by tests only, runs before a result is settled.
	settleHook func(deliveryID int64)
}

// New returns a Sender with cfg's defaults applied; Run starts it. An
// invalid cfg (or a nil pool) makes Run return at once with an error
// naming the field.
func New(pool *pgxpool.Pool, cfg Config) *Sender {
	cfg.setDefaults()
	err := cfg.validate()
	if pool == nil {
		err = errors.Join(err, errors.New("webhook sender: pool is required"))
	}
	client, cerr := guardedClient(cfg)
	m, merr := newMetrics(cfg.Registerer)
	return &Sender{pool: pool, cfg: cfg, cfgErr: errors.Join(err, cerr, merr), client: client,
		wake: make(chan struct{}, 1), metrics: m, longest: cfg.longest(),
		inflight: map[string]int{}, slow: map[string]int{}, running: map[*slot]struct{}{}, limits: map[string]*rate.Limiter{}}
}

// Wake makes a running Sender look for due deliveries now rather than at
// its next poll: call it after committing a transaction that enqueued
// messages. It never blocks.
func (s *Sender) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run delivers due webhooks until ctx is done. Then it cancels the
// requests in flight, releases their leases, records the results of those
// that completed, and returns nil. It returns at once the error of an
// invalid configuration.
func (s *Sender) Run(ctx context.Context) error {
	if s.cfgErr != nil {
		return s.cfgErr
	}
	// One settler records every result, many per statement: under load
	// results batch up instead of holding a connection each, and leasing
	// never queues behind them for the pool.
	results := make(chan settled, s.cfg.Concurrency)
	settlerDone := make(chan struct{})
	go func() { defer close(settlerDone); s.settler(ctx, results) }()
	var wg sync.WaitGroup
	poll.DrainOrWake(ctx, s.cfg.PollInterval, s.wake, func(ctx context.Context) (int, error) {
		full, err := s.dispatch(ctx, &wg, results)
		if full {
			return 1, err // took all it asked for: more may be due
		}
		return 0, err
	}, func(err error) { s.cfg.Logger.Warn("lease webhook deliveries", "error", err.Error()) })
	wg.Wait()
	close(results)
	<-settlerDone
	return nil
}

type delivery struct {
	ID            int64
	MessageID     string
	AccountID     string
	EventType     string
	OccurredAt    time.Time
	SchemaVersion int
	Payload       []byte
	Traceparent   string
	Attempts      int
	EndpointID    string
	URL           string
	APIVersion    string
	Secret        string  // as stored, sealed or not
	PrevSecret    *string // a rotated-out secret still in its grace period
	RateLimit     *int
	Suspect       bool // the endpoint's last attempt failed, or a request to it is slow
	LeaseToken    string
	Picked        int // deliveries the lease picked, some perhaps taken by another Sender meanwhile
}

// leaseEndpoint is the lease's look-up of a candidate's endpoint (d), no
// row when the endpoint must not get a request now; see leaseSQL.
const leaseEndpoint = `
    SELECT e.consecutive_failures > 0 OR e.id = ANY ($11::uuid[]) AS suspect,
           e.consecutive_failures >= $10 AS half_open, e.rate_limit
    FROM webhook_endpoints e
    WHERE e.id = d.endpoint_id
      AND e.disabled_at IS NULL
      AND (e.circuit_open_until IS NULL OR e.circuit_open_until <= now())
      AND ((e.consecutive_failures = 0 AND e.id <> ALL ($11::uuid[])) OR $9 > 0)
      AND (e.consecutive_failures < $10 OR (
          NOT EXISTS (SELECT 1 FROM busy b WHERE b.endpoint_id = e.id)
          AND (SELECT count(*) FROM (SELECT FROM webhook_endpoint_deliveries x
                                     WHERE x.endpoint_id = e.id AND x.status = 'pending'
                                       AND x.next_attempt_at > now() AND x.lease_token IS NOT NULL
                                     LIMIT 1) probe) = 0))
    OFFSET 0`

// leaseRoom keeps the lease's candidates (d) to endpoints with room: under
// their in-flight bound here, with a rate token left.
const leaseRoom = `NOT EXISTS (SELECT 1 FROM busy b WHERE b.endpoint_id = d.endpoint_id AND b.n >= $5)
      AND NOT EXISTS (SELECT 1 FROM tok t WHERE t.endpoint_id = d.endpoint_id AND t.n < 1)`

// leaseSQL leases up to $1 due deliveries for $2 seconds. Candidates are
// taken oldest due first ($6 at most), skipping rows another Sender is
// leasing right now and the endpoints that must not get a request:
// disabled, circuit open, at their in-flight bound ($3 endpoints with $4
// requests in flight here, $5 the bound), out of rate tokens ($7 endpoints
// with $8 whole tokens left; an endpoint with a rate_limit not listed has a
// full bucket, rate_limit tokens), suspect (consecutive_failures > 0, or
// one of $11, whose requests here are slow) when the suspect lane has no
// free slot ($9), half-open (its run of failures
// reached $10, the circuit's end passed) while a request is in flight to it
// anywhere: that one request is the probe. The cuts per endpoint and for
// the suspect lane are made on the candidates, so that one endpoint's
// backlog cannot fill a round. URL, secrets and api_version are read from
// the endpoint now: a change applies to pending deliveries.
//
// The candidates are read in each lane's due index order (the suspect
// lane's only when it has a slot free: the failing endpoints' due retries
// waiting there are not walked by every lease), each endpoint looked up
// by its key (the LATERAL with OFFSET 0 keeps the planner from joining
// every endpoint by hash and sorting all due deliveries, which it prefers
// once many are due, at many times the cost). The probe check reads only
// a half-open candidate's own leased deliveries. Only the deliveries
// picked are locked (SKIP LOCKED, rechecked as still due): locking every
// candidate wrote a row lock for each of up to $6 rows to lease $1. Of two
// Senders picking the same rows, the one left short (fewer leased than
// picked, the last column) goes round again at once.
const leaseSQL = `
WITH busy AS (
    SELECT * FROM unnest($3::uuid[], $4::int[]) AS b(endpoint_id, n)
), tok AS (
    SELECT * FROM unnest($7::uuid[], $8::int[]) AS t(endpoint_id, n)
), cand AS (
    (SELECT d.id, d.endpoint_id, d.next_attempt_at, e.suspect, e.half_open, e.rate_limit
     FROM webhook_endpoint_deliveries d CROSS JOIN LATERAL (` + leaseEndpoint + `) e
     WHERE d.status = 'pending' AND NOT d.suspect AND d.next_attempt_at <= now() AND ` + leaseRoom + `
     ORDER BY d.next_attempt_at
     LIMIT $6)
    UNION ALL
    (SELECT d.id, d.endpoint_id, d.next_attempt_at, e.suspect, e.half_open, e.rate_limit
     FROM webhook_endpoint_deliveries d CROSS JOIN LATERAL (` + leaseEndpoint + `) e
     WHERE $9 > 0 AND d.status = 'pending' AND d.suspect AND d.next_attempt_at <= now() AND ` + leaseRoom + `
     ORDER BY d.next_attempt_at
     LIMIT least($6, $9 * $5))
), per_endpoint AS (
    SELECT r.id, r.next_attempt_at, r.suspect FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.endpoint_id ORDER BY c.next_attempt_at, c.id) AS rn
        FROM cand c
    ) r
    LEFT JOIN busy b ON b.endpoint_id = r.endpoint_id
    LEFT JOIN tok t ON t.endpoint_id = r.endpoint_id
    WHERE r.rn <= $5 - coalesce(b.n, 0)
      AND (r.rate_limit IS NULL OR r.rn <= coalesce(t.n, r.rate_limit))
      AND (NOT r.half_open OR r.rn = 1)
), pick AS (
    SELECT p.id FROM (
        SELECT p.*, row_number() OVER (PARTITION BY p.suspect ORDER BY p.next_attempt_at, p.id) AS sn
        FROM per_endpoint p
    ) p
    WHERE NOT p.suspect OR p.sn <= $9
    ORDER BY p.next_attempt_at, p.id
    LIMIT $1
), locked AS (
    SELECT d.id FROM webhook_endpoint_deliveries d
    WHERE d.id = ANY (ARRAY(SELECT id FROM pick)) AND d.status = 'pending' AND d.next_attempt_at <= now()
    FOR UPDATE SKIP LOCKED
)
UPDATE webhook_endpoint_deliveries d
SET lease_token = gen_random_uuid(), next_attempt_at = now() + make_interval(secs => $2)
FROM locked, webhook_endpoints e, webhook_messages m
WHERE d.id = locked.id AND e.id = d.endpoint_id AND m.id = d.message_id
RETURNING d.id, d.message_id::text, m.account_id, m.event_type, m.occurred_at, m.schema_version, m.payload,
          m.traceparent, d.attempts, d.endpoint_id::text, e.url, e.api_version, e.secret,
          CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret END,
          e.rate_limit, e.consecutive_failures > 0 OR e.id = ANY ($11::uuid[]), d.lease_token::text,
          (SELECT count(*) FROM pick)`

// dispatch leases as many due deliveries as there are free slots and
// starts a request for each. It reports whether to go round again at
// once: it got every one it asked for, or another Sender took some it
// picked.
func (s *Sender) dispatch(ctx context.Context, wg *sync.WaitGroup, results chan<- settled) (bool, error) {
	now := time.Now()
	s.mu.Lock()
	// Under pressure (less than a quarter of the slots free), a request
	// slower than a tenth of SlowAfter gives its slot up at once: a
	// burst of requests to endpoints newly slow, each holding a slot for
	// SlowAfter before it is known slow, would otherwise take the
	// healthy endpoints' capacity.
	if free := s.cfg.Concurrency - s.total; free < (s.cfg.Concurrency+3)/4 && s.cfg.SlowAfter < s.cfg.Timeout {
		for sl := range s.running {
			if now.Sub(sl.started) >= s.cfg.SlowAfter/10 {
				s.demoteLocked(sl)
			}
		}
	}
	free := s.cfg.Concurrency - s.total
	suspectFree := s.cfg.SuspectConcurrency - s.suspect
	endpoints := make([]string, 0, len(s.inflight))
	counts := make([]int32, 0, len(s.inflight))
	for id, n := range s.inflight {
		endpoints = append(endpoints, id)
		counts = append(counts, int32(n))
	}
	slow := make([]string, 0, len(s.slow))
	for id := range s.slow {
		slow = append(slow, id)
	}
	var limited []string
	var tokens []int32
	for id, l := range s.limits {
		t := l.TokensAt(now)
		if t >= float64(l.Burst()) {
			delete(s.limits, id) // full: as good as unknown
			continue
		}
		limited = append(limited, id)
		tokens = append(tokens, int32(math.Floor(t)))
	}
	s.mu.Unlock()
	if free <= 0 {
		return false, nil // a slot coming free wakes the Sender
	}
	if limited == nil {
		limited, tokens = []string{}, []int32{}
	}
	// The request's deadline is taken before the lease starts, so it ends
	// at least LeaseMargin before the lease does.
	deadline := time.Now().Add(s.cfg.Timeout)
	lease := s.cfg.Timeout + s.cfg.LeaseMargin
	var due []delivery
	if err := s.unflushed(ctx, leaseSQL, []any{free, lease.Seconds(), endpoints, counts, s.cfg.PerEndpoint,
		min(free*s.cfg.PerEndpoint, 1000), limited, tokens, max(suspectFree, 0), s.cfg.CircuitFailures, slow},
		func(rows pgx.Rows) error {
			var err error
			due, err = pgx.CollectRows(rows, pgx.RowToStructByPos[delivery])
			return err
		}); err != nil {
		return false, fmt.Errorf("lease webhook deliveries: %w", err)
	}
	// The tokens are spent now, when the requests go out, not at now, when
	// the lease began: the tokens that came in while it waited (a slow
	// statement, a lock) were not in the count it leased by, and spent as
	// of its start they would be counted again by the next lease, letting
	// through twice the endpoint's burst at once. As tokens only grow with
	// time, the bucket still holds what the lease took.
	sent := time.Now()
	for _, d := range due {
		sl := &slot{d: d, suspect: d.Suspect, started: sent}
		s.mu.Lock()
		s.inflight[d.EndpointID]++
		s.total++
		s.running[sl] = struct{}{}
		if d.Suspect {
			s.suspect++
		}
		if d.RateLimit != nil {
			l := s.limits[d.EndpointID]
			if l == nil {
				l = rate.NewLimiter(rate.Limit(*d.RateLimit), *d.RateLimit)
				s.limits[d.EndpointID] = l
			} else if l.Limit() != rate.Limit(*d.RateLimit) {
				l.SetLimitAt(sent, rate.Limit(*d.RateLimit))
				l.SetBurstAt(sent, *d.RateLimit)
			}
			// The lease took no more than the tokens there were: this
			// never waits, it only spends one.
			l.AllowN(sent, 1)
		}
		s.mu.Unlock()
		wg.Go(func() { s.deliver(ctx, sl, deadline, results) })
	}
	return len(due) == free || (len(due) > 0 && due[0].Picked > len(due)), nil
}

// slot is a request in flight, as the bounds count it.
type slot struct {
	d        delivery
	started  time.Time
	suspect  bool // counted in the suspect lane
	demoted  bool // moved there for running longer than SlowAfter: no longer in total
	finished bool
}

// demote moves a request that has run for SlowAfter to the suspect lane,
// freeing its slot for the healthy endpoints, and makes its endpoint
// suspect in this Sender until its slow requests end: a slow endpoint's
// first requests cannot hold the healthy ones' slots for a whole Timeout
// before an attempt of its has even failed. Requests in flight are then at
// most Concurrency plus the demoted ones.
func (s *Sender) demote(sl *slot) {
	s.mu.Lock()
	ok := s.demoteLocked(sl)
	s.mu.Unlock()
	if ok {
		s.Wake()
	}
}

// demoteLocked is demote with s.mu held, reporting whether it moved sl.
func (s *Sender) demoteLocked(sl *slot) bool {
	if sl.finished || sl.demoted {
		return false
	}
	sl.demoted = true
	s.total--
	delete(s.running, sl)
	if !sl.suspect {
		sl.suspect = true
		s.suspect++
	}
	s.slow[sl.d.EndpointID]++
	return true
}

// done frees a request's slot. It wakes the Sender when a bound was
// reached, as due deliveries may have been left behind for it.
func (s *Sender) done(sl *slot) {
	s.mu.Lock()
	if sl.finished {
		s.mu.Unlock()
		return
	}
	sl.finished = true
	id := sl.d.EndpointID
	wasFull := s.inflight[id] >= s.cfg.PerEndpoint || s.total >= s.cfg.Concurrency ||
		(sl.suspect && s.suspect >= s.cfg.SuspectConcurrency)
	if s.inflight[id]--; s.inflight[id] == 0 {
		delete(s.inflight, id)
	}
	if !sl.demoted {
		s.total--
		delete(s.running, sl)
	} else if s.slow[id]--; s.slow[id] == 0 {
		delete(s.slow, id)
	}
	if sl.suspect {
		s.suspect--
	}
	s.mu.Unlock()
	if wasFull {
		s.Wake()
	}
}

// deliver makes one attempt and hands it to the settler, or releases the
// lease when the shutdown cut the attempt short.
func (s *Sender) deliver(ctx context.Context, sl *slot, deadline time.Time, results chan<- settled) {
	d := sl.d
	slowTimer := time.AfterFunc(s.cfg.SlowAfter, func() { s.demote(sl) })
	a := s.attempt(ctx, d, deadline)
	slowTimer.Stop()
	if a.err != nil && !a.permanent && ctx.Err() != nil {
		s.done(sl)
		// Releasing must outlive the shutdown that ended ctx; it is
		// bounded by its own timeout instead.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := s.pool.Exec(rctx, `
			UPDATE webhook_endpoint_deliveries SET lease_token = NULL, next_attempt_at = now()
			WHERE id = $1 AND lease_token = $2 AND status = 'pending'`, d.ID, d.LeaseToken); err != nil {
			s.cfg.Logger.Warn("release webhook delivery", "message_id", d.MessageID, "error", err.Error())
		}
		return
	}
	s.metrics.observe(a)
	if s.settleHook != nil {
		s.settleHook(d.ID)
	}
	r := s.outcomeOf(d, a)
	r.slot = sl
	// A failed request keeps its slot until its result is settled: the
	// endpoint's next request must see the circuit this one may open (a
	// 429 with Retry-After, the last of a run) rather than race it. A
	// success frees it at once: the bound is on requests, and a healthy
	// endpoint's next one need not wait for a database round trip.
	r.holdSlot = a.sent && r.status != "delivered"
	if !r.holdSlot {
		s.done(sl)
	}
	results <- r
}

// result is one attempt's outcome.
type result struct {
	code       int // 0: no response
	latency    time.Duration
	err        error
	permanent  bool          // err is the delivery's own fault: never retried
	retryAfter time.Duration // the endpoint's Retry-After; -1: none
	location   string        // a redirect's target
	sent       bool          // a request was made: the endpoint's health counts it
	body       *string       // the response's body, bounded and redacted
	detail     error         // the network error behind err, for the log only
}

func (s *Sender) attempt(ctx context.Context, d delivery, deadline time.Time) result {
	r := result{retryAfter: -1}
	// The URL was checked when the endpoint was saved, perhaps under
	// another policy or by an older version: checked again, each time.
	if _, err := (netguard.Policy{AllowPrivate: s.cfg.AllowPrivate}).CheckURL(d.URL); err != nil {
		r.err, r.permanent = fmt.Errorf("webhook URL refused: %w", err), true
		return r
	}
	body, err := s.cfg.Render(ctx, webhooks.Message{ID: d.MessageID, AccountID: d.AccountID, EventType: d.EventType,
		OccurredAt: d.OccurredAt, SchemaVersion: d.SchemaVersion, Payload: json.RawMessage(d.Payload)}, d.APIVersion)
	if err != nil {
		r.err, r.permanent = fmt.Errorf("render: %w", err), true
		return r
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sig, err := s.signature(d, ts, body)
	if err != nil {
		// A missing or wrong secret key is the operator's to fix: retried
		// meanwhile. A secret that opens but is no key is dead.
		r.err = fmt.Errorf("cannot sign: %w", err)
		r.permanent = !errors.Is(err, secretseal.ErrNoKey) && !errors.Is(err, secretseal.ErrWrongKey)
		return r
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.URL, bytes.NewReader(body))
	if err != nil {
		r.err, r.permanent = fmt.Errorf("webhook request: %w", err), true
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set(signing.HeaderID, d.MessageID)
	req.Header.Set(signing.HeaderTimestamp, ts)
	req.Header.Set(signing.HeaderSignature, sig)
	req, span := startClientSpan(req, d.Traceparent)
	defer func() { endClientSpan(span, r) }()
	start := time.Now()
	r.sent = true
	resp, err := s.client.Do(req)
	if err != nil {
		// What is recorded is the cause's category; the error itself
		// (addresses, ports) goes to the log only.
		r.latency, r.err, r.detail = time.Since(start), errors.New(cause(err)), err
		// The client's *url.Error quotes the URL, whose query may hold the
		// account's token: the log gets what is under it.
		var ue *url.Error
		if errors.As(err, &ue) {
			r.detail = ue.Err
		}
		r.permanent = errors.Is(err, netguard.ErrBlocked) // a refused destination stays refused
		return r
	}
	// Read a little more than is kept, so that a secret the cut falls in
	// is still recognised as one; the rest is drained (bounded) so the
	// connection can be reused.
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, int64(4*s.cfg.MaxResponseBody)))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	r.latency, r.code = time.Since(start), resp.StatusCode
	if len(raw) > 0 {
		b := responseBody(raw, s.cfg.MaxResponseBody)
		r.body = &b
	}
	r.location = resp.Header.Get("Location")
	if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		r.retryAfter = ra
	}
	return r
}

// responseBody is what an attempt records of a response's body: valid
// UTF-8, secrets masked, at most limit bytes.
func responseBody(raw []byte, limit int) string {
	return truncate(redact.Body(strings.ToValidUTF8(string(raw), "\uFFFD")), limit)
}

// settled is an attempt's result as the settler records it.
type settled struct {
	d        delivery
	a        result
	status   string        // pending (retry), delivered or failed
	delay    time.Duration // until the next attempt, when pending
	openFor  time.Duration // a 429/503's Retry-After: the circuit opens at once for it; 0: no
	attempts int           // with this one
	holdSlot bool          // the request's slot is freed once settled
	slot     *slot
}

func (s *Sender) outcomeOf(d delivery, a result) settled {
	r := settled{d: d, a: a, status: "pending", attempts: d.Attempts + 1}
	switch classify(a.code, a.err, a.permanent) {
	case verdictDelivered:
		r.status = "delivered"
	case verdictRetry:
		if a.retryAfter >= 0 && (a.code == http.StatusTooManyRequests || a.code == http.StatusServiceUnavailable) {
			r.openFor = max(min(a.retryAfter, s.longest), time.Millisecond)
		}
		if r.attempts > len(s.cfg.Schedule) {
			r.status = "failed"
			break
		}
		r.delay = s.step(r.attempts)
		if a.retryAfter >= 0 {
			r.delay = min(a.retryAfter, s.longest)
		}
	default:
		r.status = "failed"
	}
	return r
}

// step is the delay after attempt n (from 1) failed, jittered.
func (s *Sender) step(n int) time.Duration {
	d := s.cfg.Schedule[min(n, len(s.cfg.Schedule))-1]
	if s.cfg.Jitter > 0 {
		d = time.Duration(float64(d) * (1 - s.cfg.Jitter + 2*s.cfg.Jitter*rand.Float64()))
	}
	return d
}

type verdict int

const (
	verdictDelivered verdict = iota
	verdictRetry
	verdictFailed
)

// classify decides an attempt's fate from its status code (0: no
// response), its error, and whether that error is the delivery's own.
func classify(code int, err error, permanent bool) verdict {
	switch {
	case err != nil && permanent:
		return verdictFailed
	case err == nil && code >= 200 && code < 300:
		return verdictDelivered
	case Retryable(code):
		return verdictRetry
	default:
		return verdictFailed
	}
}

// Retryable reports whether a delivery that got status (0: no response)
// is worth trying again: network errors and timeouts, redirects (never
// followed; the account may fix its URL), 408, 425, 429 and 5xx are; other
// 4xx mean the endpoint refuses it.
func Retryable(status int) bool {
	switch {
	case status == 0, status >= 300 && status < 400, status >= 500:
		return true
	}
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return false
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an
// HTTP-date (a date in the past is no wait).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(365*24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

func outcome(a result) string {
	switch {
	case a.err != nil:
		return a.err.Error()
	case a.code >= 300 && a.code < 400:
		return fmt.Sprintf("HTTP %d redirect to %q (redirects are not followed)", a.code, redact.URL(a.location))
	}
	return "HTTP " + strconv.Itoa(a.code)
}

// truncate cuts s to at most n bytes without splitting a UTF-8 character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
