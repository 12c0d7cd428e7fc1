package handlers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// Sender is the previous release's webhook sender: it delivers the
// legacy webhook_deliveries rows that release's NotifyMerchant recorded.
// No process of this release runs it: [NotifyMerchant] records into the
// webhook package's tables, which package webhooks/sender sends, and
// [RunHandOver] moves the legacy rows still pending there. It is kept for
// the rollout's tests (a legacy sender beside the handover) and for the
// packages that still import it; a later release deletes it.
//
// Deprecated: use package webhooks/sender.
//
// It sends concurrently, at most NotifyConfig.Concurrency requests at once
// and NotifyConfig.PerMerchant to one merchant: a merchant that hangs holds
// its own slots only, the others' deliveries go out meanwhile. Several
// Senders (processes) may run on one database; each bounds its own
// requests.
//
// A delivery is leased before it is sent: a fresh lease token, valid for
// Timeout + LeaseMargin, while the request is cancelled at Timeout, so a
// second Sender can take a delivery whose lease lapsed only once the first
// one's request has ended. The result is settled only under the same token
// and while the delivery is pending: a Sender that lost its lease (it was
// too slow to settle) records its attempt with lease_lost set and changes
// nothing else, so a late result never overwrites 'delivered'.
//
// Outcomes: a 2xx is delivered. Redirects are not followed: a 3xx is a
// failed attempt (its last_error names the status and the Location).
// Network errors, timeouts, 3xx, 408, 425, 429 and 5xx are retried, after
// Retry-After when the merchant sends one (capped by RetryBackoffMax), else
// after the backoff, until MaxAttempts; other 4xx are dead at once, and so
// is a delivery that cannot be signed (bad secret, merchant gone), whose
// URL the policy refuses, or whose host resolves to an address it refuses
// (see [netguard.Dialer]: every connection is checked on the address it is
// made to, unless NotifyConfig.AllowPrivate). What an attempt records is a
// category of its failure, never the network error itself. An attempt cut short by the Sender's
// shutdown is not recorded and does not count: its lease is released so
// that the delivery goes out again promptly.
//
// A request's slot is freed as soon as the merchant answered; one
// goroutine records the results, all those waiting in one statement.
// Leases and results commit without waiting for their WAL flush: one that
// a PostgreSQL crash forgets means the webhook is sent again, never lost.
type Sender struct {
	pool   *pgxpool.Pool
	cfg    NotifyConfig
	cfgErr error
	client *http.Client
	wake   chan struct{}
	// metrics is nil without NotifyConfig.Registerer.
	metrics *senderMetrics

	mu       sync.Mutex
	inflight map[string]int // requests in flight per merchant id
	total    int

	// settleHook, set by tests only, runs before a result is settled.
	settleHook func(deliveryID int64)
}

// NewSender returns a Sender with cfg's defaults applied; Run starts it.
//
// Deprecated: the previous release's sender; use package webhooks/sender.
// An invalid cfg (or a nil pool) makes Run return at once with an error
// naming the field.
func NewSender(pool *pgxpool.Pool, cfg NotifyConfig) *Sender {
	cfg.setDefaults()
	err := cfg.validate()
	if pool == nil {
		err = errors.Join(err, errors.New("notify config: pool is required"))
	}
	client, cerr := guardedClient(cfg)
	err = errors.Join(err, cerr)
	m, merr := newSenderMetrics(cfg.Registerer)
	err = errors.Join(err, merr)
	return &Sender{pool: pool, cfg: cfg, cfgErr: err, client: client, wake: make(chan struct{}, 1), inflight: map[string]int{},
		metrics: m}
}

// Wake makes a running Sender look for due deliveries now rather than at
// its next poll. It never blocks; wakes that come while one is pending
// merge into it.
func (s *Sender) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run delivers due webhooks until ctx is done. Then it cancels the requests
// in flight, releases their leases, and returns nil once every one ended.
// It returns at once the error of an invalid configuration.
func (s *Sender) Run(ctx context.Context) error {
	if s.cfgErr != nil {
		return s.cfgErr
	}
	// One settler records every result, many per statement: under load
	// the results batch up instead of holding a connection each, and
	// leasing never queues behind them for the pool.
	results := make(chan settled, s.cfg.Concurrency)
	settlerDone := make(chan struct{})
	go func() { defer close(settlerDone); s.settler(ctx, results) }()
	if s.metrics != nil {
		statsDone := make(chan struct{})
		go func() { defer close(statsDone); s.statsLoop(ctx) }()
		defer func() { <-statsDone }()
	}
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
	ID         int64
	MessageID  string
	URL        string
	Body       []byte
	Attempts   int
	MerchantID string
	Secret     *string // nil: the merchant is gone; as stored, sealed or not
	LeaseToken string
	PrevSecret *string // a rotated-out secret still in its grace period
	// Traceparent is the recording handler's trace context, "" if none:
	// the request's client span is its child.
	Traceparent string
}

// leaseSQL leases up to $1 due deliveries for $2 seconds, at most $5 per
// merchant counting the requests already in flight ($3 merchants, $4 their
// counts). Candidates are taken oldest due first, skipping rows another
// Sender is leasing right now and merchants already at their bound; the
// per-merchant cut is made on the candidates, so one merchant's backlog
// cannot fill a round ($6 candidates at most).
const leaseSQL = `
WITH busy AS (
    SELECT * FROM unnest($3::uuid[], $4::int[]) AS b(merchant_id, n)
), cand AS (
    SELECT d.id, d.merchant_id, d.next_attempt_at FROM webhook_deliveries d
    WHERE d.status = 'pending' AND d.next_attempt_at <= now()
      AND NOT EXISTS (SELECT 1 FROM busy b WHERE b.merchant_id = d.merchant_id AND b.n >= $5)
    ORDER BY d.next_attempt_at
    LIMIT $6
    FOR UPDATE SKIP LOCKED
), pick AS (
    SELECT r.id FROM (
        SELECT c.id, c.merchant_id, c.next_attempt_at,
               row_number() OVER (PARTITION BY c.merchant_id ORDER BY c.next_attempt_at, c.id) AS rn
        FROM cand c
    ) r LEFT JOIN busy b ON b.merchant_id = r.merchant_id
    WHERE r.rn <= $5 - coalesce(b.n, 0)
    ORDER BY r.next_attempt_at, r.id
    LIMIT $1
)
UPDATE webhook_deliveries d
SET lease_token = gen_random_uuid(), next_attempt_at = now() + make_interval(secs => $2)
FROM pick WHERE d.id = pick.id
RETURNING d.id, d.message_id::text, d.url, d.body, d.attempts, d.merchant_id::text,
          (SELECT m.webhook_secret FROM merchants m WHERE m.id = d.merchant_id), d.lease_token::text,
          (SELECT m.previous_webhook_secret FROM merchants m
           WHERE m.id = d.merchant_id AND m.previous_webhook_secret_expires_at > now()),
          d.traceparent`

// dispatch leases as many due deliveries as there are free slots and
// starts a request for each. It reports whether it got every one it asked
// for.
func (s *Sender) dispatch(ctx context.Context, wg *sync.WaitGroup, results chan<- settled) (bool, error) {
	s.mu.Lock()
	free := s.cfg.Concurrency - s.total
	merchants := make([]string, 0, len(s.inflight))
	counts := make([]int32, 0, len(s.inflight))
	for m, n := range s.inflight {
		merchants = append(merchants, m)
		counts = append(counts, int32(n))
	}
	s.mu.Unlock()
	if free == 0 {
		return false, nil // a slot coming free wakes the Sender
	}
	// The request's deadline is taken before the lease starts, so it ends
	// at least LeaseMargin before the lease does.
	deadline := time.Now().Add(s.cfg.Timeout)
	lease := s.cfg.Timeout + s.cfg.LeaseMargin
	var due []delivery
	if err := s.unflushed(ctx, leaseSQL, []any{free, lease.Seconds(), merchants, counts, s.cfg.PerMerchant,
		min(free*s.cfg.PerMerchant, 1000)}, func(rows pgx.Rows) error {
		var err error
		due, err = pgx.CollectRows(rows, pgx.RowToStructByPos[delivery])
		return err
	}); err != nil {
		return false, fmt.Errorf("lease webhook deliveries: %w", err)
	}
	for _, d := range due {
		s.mu.Lock()
		s.inflight[d.MerchantID]++
		s.total++
		s.mu.Unlock()
		wg.Go(func() { s.deliver(ctx, d, deadline, results) })
	}
	return len(due) == free, nil
}

// done frees a request's slot as soon as the merchant answered, before the
// result is settled (the delivery stays leased until then): the bound is on
// requests, and a merchant's next request need not wait for a database
// round trip. It wakes the Sender when the slot's merchant or the Sender
// was full, as due deliveries may have been left behind for it.
func (s *Sender) done(merchantID string) {
	s.mu.Lock()
	wasFull := s.inflight[merchantID] >= s.cfg.PerMerchant || s.total >= s.cfg.Concurrency
	if s.inflight[merchantID]--; s.inflight[merchantID] == 0 {
		delete(s.inflight, merchantID)
	}
	s.total--
	s.mu.Unlock()
	if wasFull {
		s.Wake()
	}
}

// deliver makes one attempt and hands it to the settler, or releases the
// lease when the shutdown cut the attempt short.
func (s *Sender) deliver(ctx context.Context, d delivery, deadline time.Time, results chan<- settled) {
	a := s.attempt(ctx, d, deadline)
	s.done(d.MerchantID)
	if a.err != nil && !a.permanent && ctx.Err() != nil {
		// Releasing must outlive the shutdown that ended ctx; it is
		// bounded by its own timeout instead.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := s.pool.Exec(rctx, `
			UPDATE webhook_deliveries SET lease_token = NULL, next_attempt_at = now()
			WHERE id = $1 AND lease_token = $2 AND status = 'pending'`, d.ID, d.LeaseToken); err != nil {
			s.cfg.Logger.Warn("release webhook delivery", "message_id", d.MessageID, "error", err.Error())
		}
		return
	}
	s.metrics.observe(a)
	if s.settleHook != nil {
		s.settleHook(d.ID)
	}
	results <- s.outcomeOf(d, a)
}

// result is one attempt's outcome.
type result struct {
	code       int // 0: no response
	latency    time.Duration
	err        error
	permanent  bool          // err is the delivery's own fault: never retried
	retryAfter time.Duration // the merchant's Retry-After; -1: none
	location   string        // a redirect's target
	sent       bool          // a request was made: latency is its duration
	detail     error         // the network error behind err, for the log only
}

func (s *Sender) attempt(ctx context.Context, d delivery, deadline time.Time) result {
	r := result{retryAfter: -1}
	// The URL was checked when the merchant was created, perhaps under
	// another policy or by an older version: checked again, each time.
	if _, err := (netguard.Policy{AllowPrivate: s.cfg.AllowPrivate}).CheckURL(d.URL); err != nil {
		r.err, r.permanent = fmt.Errorf("webhook URL refused: %w", err), true
		return r
	}
	if d.Secret == nil {
		r.err, r.permanent = fmt.Errorf("cannot sign: merchant %s no longer exists", d.MerchantID), true
		return r
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sig, err := s.signature(d, ts)
	if err != nil {
		// A missing or wrong OUTFLOW_SECRET_KEY is the operator's to fix:
		// retried meanwhile. A secret that opens but is no key is dead.
		r.err, r.permanent = fmt.Errorf("cannot sign: %w", err), !errors.Is(err, secretseal.ErrNoKey) && !errors.Is(err, secretseal.ErrWrongKey)
		return r
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		r.err, r.permanent = fmt.Errorf("webhook request: %w", err), true
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", d.MessageID)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", sig)
	req, span := startClientSpan(req, d.Traceparent)
	defer func() { endClientSpan(span, r) }()
	start := time.Now()
	r.sent = true
	resp, err := s.client.Do(req)
	if err != nil {
		// What is recorded is the cause's category; the error itself
		// (addresses, ports) goes to the log only.
		r.latency, r.err, r.detail = time.Since(start), errors.New(cause(err)), err
		// A destination the policy refuses stays refused: no retries.
		r.permanent = errors.Is(err, netguard.ErrBlocked)
		return r
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	r.latency, r.code = time.Since(start), resp.StatusCode
	r.location = resp.Header.Get("Location")
	if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		r.retryAfter = ra
	}
	return r
}

// settled is an attempt's result as the settler records it.
type settled struct {
	d        delivery
	a        result
	status   string        // pending (retry), delivered or dead
	delay    time.Duration // until the next attempt, when pending
	attempts int           // with this one
}

func (s *Sender) outcomeOf(d delivery, a result) settled {
	r := settled{d: d, a: a, status: "pending", attempts: d.Attempts + 1}
	switch v := classify(a.code, a.err, a.permanent); {
	case v == verdictDelivered:
		r.status = "delivered"
	case v == verdictRetry && r.attempts < s.cfg.MaxAttempts:
		r.delay = s.backoff(r.attempts)
		if a.retryAfter >= 0 {
			r.delay = min(a.retryAfter, s.cfg.RetryBackoffMax)
		}
	default:
		r.status = "dead"
	}
	return r
}

// settler records results until results is closed, every result waiting
// at the time in one statement (at most 200).
func (s *Sender) settler(ctx context.Context, results <-chan settled) {
	// Settling must outlive the shutdown that ended ctx: results of
	// requests that completed are recorded.
	ctx = context.WithoutCancel(ctx)
	for r := range results {
		batch := []settled{r}
	more:
		for len(batch) < 200 {
			select {
			case r, ok := <-results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := s.settle(sctx, batch); err != nil {
			// The deliveries stay leased; they go out again once the
			// leases lapse, their attempts unrecorded.
			s.cfg.Logger.Warn("settle webhook deliveries", "deliveries", len(batch), "error", err.Error())
		}
		cancel()
	}
}

// settleSQL records attempts and, for each delivery the sender still holds
// the lease of (token) while it is pending, applies its outcome: status,
// next attempt in delay seconds, last error. Every attempt is recorded,
// lease_lost when nothing was applied (by its token: a batch can hold the
// late result of a lapsed lease beside the result of the sender's own next
// lease of the same delivery), except that of a delivery no longer
// there: a late result whose delivery another sender settled and retention
// purged meanwhile would fail the whole statement on the foreign key, and
// the other results with it. live locks the deliveries against that purge
// (FOR KEY SHARE, as the foreign key check would; one deleted meanwhile is
// skipped rather than an error).
const settleSQL = `
WITH r AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::float8[], $5::text[], $6::int[], $7::float8[], $8::text[])
        AS r(id, token, status, delay, last_error, code, latency_ms, error)
), live AS (
    SELECT d.id FROM webhook_deliveries d WHERE d.id IN (SELECT id FROM r) FOR KEY SHARE
), upd AS (
    UPDATE webhook_deliveries d
    SET status = r.status, attempts = d.attempts + 1, lease_token = NULL,
        next_attempt_at = now() + make_interval(secs => r.delay), last_error = r.last_error,
        delivered_at = CASE WHEN r.status = 'delivered' THEN now() END
    FROM r
    WHERE d.id = r.id AND d.lease_token = r.token AND d.status = 'pending'
    RETURNING d.id, r.token
)
INSERT INTO webhook_attempts (delivery_id, status_code, latency_ms, error, lease_lost)
SELECT r.id, r.code, r.latency_ms, r.error, NOT EXISTS (SELECT 1 FROM upd WHERE upd.id = r.id AND upd.token = r.token)
FROM r JOIN live USING (id)
RETURNING delivery_id, lease_lost`

func (s *Sender) settle(ctx context.Context, batch []settled) error {
	n := len(batch)
	var (
		ids      = make([]int64, n)
		tokens   = make([]string, n)
		statuses = make([]string, n)
		delays   = make([]float64, n)
		lastErrs = make([]*string, n)
		codes    = make([]*int, n)
		lats     = make([]float64, n)
		errs     = make([]*string, n)
	)
	for i, r := range batch {
		ids[i], tokens[i], statuses[i], delays[i] = r.d.ID, r.d.LeaseToken, r.status, r.delay.Seconds()
		lats[i] = float64(r.a.latency.Microseconds()) / 1000
		if r.status != "delivered" {
			e := truncate(outcome(r.a), 2000)
			lastErrs[i] = &e
		}
		if r.a.err != nil {
			e := truncate(r.a.err.Error(), 2000)
			errs[i] = &e
		}
		if r.a.code != 0 {
			codes[i] = &r.a.code
		}
	}
	lost := map[int64]bool{}
	if err := s.unflushed(ctx, settleSQL, []any{ids, tokens, statuses, delays, lastErrs, codes, lats, errs},
		func(rows pgx.Rows) error {
			var id int64
			var l bool
			_, err := pgx.ForEachRow(rows, []any{&id, &l}, func() error {
				if l {
					lost[id] = true
				}
				return nil
			})
			return err
		}); err != nil {
		return fmt.Errorf("settle webhook deliveries: %w", err)
	}
	for _, r := range batch {
		s.metrics.count(r, lost[r.d.ID])
		switch {
		case lost[r.d.ID]:
			s.cfg.Logger.Warn("webhook delivery lease lost before its result was recorded", "message_id", r.d.MessageID,
				"merchant_id", r.d.MerchantID, "result", outcome(r.a))
		case r.status == "dead" && r.a.detail != nil:
			s.cfg.Logger.Warn("webhook delivery dead", "message_id", r.d.MessageID, "merchant_id", r.d.MerchantID,
				"attempts", r.attempts, "last", outcome(r.a), "detail", r.a.detail.Error())
		case r.status == "dead":
			s.cfg.Logger.Warn("webhook delivery dead", "message_id", r.d.MessageID, "merchant_id", r.d.MerchantID,
				"attempts", r.attempts, "last", outcome(r.a))
		}
	}
	return nil
}

// unflushed runs one statement in a transaction of its own whose commit
// does not wait for its WAL flush, in one round trip; fn reads its rows. A
// lease or a settle that a PostgreSQL crash forgets means the webhook is
// sent again (a duplicate, which the merchant may get anyway), never lost;
// waiting for the flush of each would cost a disk sync per webhook, twice.
func (s *Sender) unflushed(ctx context.Context, sql string, args []any, fn func(pgx.Rows) error) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	b.Queue(sql, args...).Query(fn)
	b.Queue("COMMIT")
	return s.pool.SendBatch(ctx, b).Close()
}

type verdict int

const (
	verdictDelivered verdict = iota
	verdictRetry
	verdictDead
)

// classify decides an attempt's fate from its status code (0: no
// response), its error, and whether that error is the delivery's own.
func classify(code int, err error, permanent bool) verdict {
	switch {
	case err != nil && permanent:
		return verdictDead
	case err == nil && code >= 200 && code < 300:
		return verdictDelivered
	case Retryable(code):
		return verdictRetry
	default:
		return verdictDead
	}
}

// Retryable reports whether a delivery that got status (0: no response)
// is worth trying again: network errors and timeouts, redirects (never
// followed; the merchant may fix its URL), 408, 425, 429 and 5xx are;
// other 4xx mean the merchant refuses it.
//
// Deprecated: the previous release's rule; see webhooks/sender.Retryable.
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
		return fmt.Sprintf("HTTP %d redirect to %q (redirects are not followed)", a.code, a.location)
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

func (s *Sender) backoff(attempt int) time.Duration {
	return backoff.Delay(s.cfg.RetryBackoff, s.cfg.RetryBackoffMax, attempt)
}
