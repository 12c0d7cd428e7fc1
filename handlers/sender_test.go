package handlers_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/outflowtest"
)

func newSender(t *testing.T, p *pipeline, cfg handlers.NotifyConfig) *handlers.Sender {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	cfg.AllowPrivate = true // the merchants are httptest servers; sender_ssrf_test.go tests without
	return handlers.NewSender(p.schema.Pool, cfg)
}

func merchant(t *testing.T, p *pipeline, name, url string) app.CreatedMerchant {
	t.Helper()
	m, err := p.svc.CreateMerchant(context.Background(), app.NewMerchant{Name: name, WebhookURL: url})
	require.NoError(t, err)
	return m
}

// record inserts n pending deliveries for m, as NotifyMerchant's handler
// would, and returns their ids.
func record(t *testing.T, p *pipeline, m app.CreatedMerchant, n int) []int64 {
	t.Helper()
	var ids []int64
	rows, err := p.schema.Pool.Query(context.Background(), `
		INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body)
		SELECT gen_random_uuid(), $1, $2, 'payment.paid', '{"type":"payment.paid"}' FROM generate_series(1, $3)
		RETURNING id`, m.ID, m.WebhookURL, n)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

func count(t *testing.T, p *pipeline, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// A redirect is never followed: the POST is not turned into a GET whose
// 2xx would count as delivered; the 3xx is a failed attempt naming where
// it pointed.
func TestSenderNeverFollowsRedirects(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	var followed atomic.Int32
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/target" {
			followed.Add(1)
			w.WriteHeader(http.StatusOK)
			return
		}
		var code int
		_, _ = fmt.Sscanf(r.URL.Path, "/moved/%d", &code)
		w.Header().Set("Location", srv.URL+"/target")
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	codes := []int{301, 302, 303, 307, 308}
	for _, c := range codes {
		record(t, p, merchant(t, p, fmt.Sprint(c), fmt.Sprintf("%s/moved/%d", srv.URL, c)), 1)
	}
	// A caller's own client that follows redirects is overridden too.
	run(t, newSender(t, p, handlers.NotifyConfig{Client: &http.Client{}, MaxAttempts: 2, Backoff: 10 * time.Millisecond,
		BackoffMax: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond}).Run)

	outflowtest.WaitFor(t, 10*time.Second, "every redirected delivery given up", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'dead'`) == len(codes)
	})
	require.Zero(t, followed.Load(), "no redirect followed")
	require.Zero(t, count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`))
	for _, c := range codes {
		var lastErr string
		require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
			`SELECT last_error FROM webhook_deliveries WHERE url LIKE '%/moved/' || $1`, fmt.Sprint(c)).Scan(&lastErr))
		require.Contains(t, lastErr, fmt.Sprintf("HTTP %d redirect to", c))
		require.Contains(t, lastErr, srv.URL+"/target")
		require.Equal(t, 2, count(t, p, `SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id
			WHERE d.url LIKE '%/moved/' || $1 AND a.status_code = $2`, fmt.Sprint(c), c), "both attempts recorded with status %d", c)
	}
}

// One merchant's server hangs: it holds only its own slots while the other
// merchants' deliveries go out; on shutdown its requests are cancelled, not
// counted, and its deliveries released to go out again at once.
func TestSlowMerchantDoesNotDelayOthers(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	var hanging, maxHanging, cancelled atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			_, _ = io.ReadAll(r.Body) // then the server sees the client leave
			n := hanging.Add(1)
			for m := maxHanging.Load(); n > m && !maxHanging.CompareAndSwap(m, n); m = maxHanging.Load() {
			}
			defer hanging.Add(-1)
			select {
			case <-r.Context().Done():
				cancelled.Add(1)
			case <-release:
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for the handlers

	slow := merchant(t, p, "Slow", srv.URL+"/slow")
	slowIDs := record(t, p, slow, 6) // recorded first: due first
	for i := range 5 {
		record(t, p, merchant(t, p, fmt.Sprint("Fast", i), srv.URL+"/fast"), 4)
	}
	sender := newSender(t, p, handlers.NotifyConfig{Timeout: time.Minute, PerMerchant: 2, Concurrency: 8,
		PollInterval: 20 * time.Millisecond})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sender.Run(ctx) }()
	t.Cleanup(stop)

	outflowtest.WaitFor(t, 20*time.Second, "the other merchants served", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`) == 20
	})
	outflowtest.WaitFor(t, 10*time.Second, "the slow merchant to hold its two slots", func() bool { return hanging.Load() == 2 })
	require.Equal(t, int32(2), maxHanging.Load(), "and never more")

	stop()
	require.NoError(t, <-done)
	outflowtest.WaitFor(t, 10*time.Second, "the slow merchant to see both requests cancelled", func() bool { return cancelled.Load() == 2 })
	require.Zero(t, count(t, p, `SELECT count(*) FROM webhook_attempts WHERE delivery_id = ANY($1)`, slowIDs),
		"an attempt cut short by shutdown is not recorded")
	require.Equal(t, len(slowIDs), count(t, p, `SELECT count(*) FROM webhook_deliveries
		WHERE id = ANY($1) AND status = 'pending' AND attempts = 0 AND lease_token IS NULL AND next_attempt_at <= now()`, slowIDs),
		"released, due again at once")
}

// Two senders share the deliveries with a short lease and a merchant that
// sometimes fails: each delivery is delivered once, by the sender holding
// its lease, and every request the merchant got is an attempt on record.
func TestTwoSendersAtOnce(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	var mu sync.Mutex
	requests := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("webhook-id")
		mu.Lock()
		requests[id]++
		n := requests[id]
		mu.Unlock()
		time.Sleep(time.Duration(len(id)%7) * time.Millisecond)
		if n == 1 && id[0] < '4' { // a quarter fail once
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	for i := range 4 {
		record(t, p, merchant(t, p, fmt.Sprint("M", i), srv.URL+"/hook"), 25)
	}
	cfg := handlers.NotifyConfig{Timeout: 300 * time.Millisecond, LeaseMargin: 50 * time.Millisecond, Backoff: 10 * time.Millisecond,
		BackoffMax: 20 * time.Millisecond, PollInterval: 5 * time.Millisecond, PerMerchant: 3, Concurrency: 6}
	run(t, newSender(t, p, cfg).Run)
	run(t, newSender(t, p, cfg).Run)

	outflowtest.WaitFor(t, 30*time.Second, "every delivery delivered", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`) == 100
	})
	require.Zero(t, count(t, p, `
		SELECT count(*) FROM webhook_deliveries d
		WHERE (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id AND a.status_code = 200 AND NOT a.lease_lost) <> 1
		   OR d.attempts <> (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id AND NOT a.lease_lost)`),
		"one successful attempt by a lease holder per delivery, and its count matches")
	// A sender that lost a lease records its attempt after the delivery
	// was delivered by the other: wait for it. At least as many attempts
	// as requests: an attempt whose 300 ms ran out before the merchant's
	// server read it (a loaded machine) is on record, and the merchant
	// never got it.
	var got, recorded int
	t.Cleanup(func() {
		if t.Failed() { // which side was short, for the next time this fails under load
			t.Logf("the merchant got %d requests, webhook_attempts holds %d", got, recorded)
		}
	})
	outflowtest.WaitFor(t, 10*time.Second, "every request the merchant got on record", func() bool {
		mu.Lock()
		got = 0
		for _, n := range requests {
			got += n
		}
		mu.Unlock()
		recorded = count(t, p, `SELECT count(*) FROM webhook_attempts`)
		return recorded >= got
	})
}

// A sender whose lease lapsed: a second sender takes the delivery only
// after the first one's request ended, and the first one's late result
// neither overwrites 'delivered' nor counts.
func TestLateResultDoesNotOverwriteDelivered(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	var (
		mu          sync.Mutex
		firstEnded  time.Time
		secondBegan time.Time
		calls       int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		if n == 2 {
			secondBegan = time.Now()
		}
		mu.Unlock()
		if n == 1 { // hangs until the first sender gives up on it
			_, _ = io.ReadAll(r.Body) // then the server sees the client leave
			<-r.Context().Done()
			mu.Lock()
			firstEnded = time.Now()
			mu.Unlock()
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	id := record(t, p, merchant(t, p, "M", srv.URL), 1)[0]

	cfg := handlers.NotifyConfig{Timeout: 300 * time.Millisecond, LeaseMargin: 200 * time.Millisecond, Backoff: 10 * time.Millisecond,
		BackoffMax: 20 * time.Millisecond}
	first := newSender(t, p, withPoll(cfg, time.Hour)) // leases once, at start
	hold := make(chan struct{})
	handlers.SetSettleHook(first, func(int64) { <-hold })
	run(t, first.Run)
	t.Cleanup(func() { // before first.Run's, which waits for the held result
		select {
		case <-hold:
		default:
			close(hold)
		}
	})
	outflowtest.WaitFor(t, 10*time.Second, "the first request", func() bool { mu.Lock(); defer mu.Unlock(); return calls == 1 })
	run(t, newSender(t, p, withPoll(cfg, 10*time.Millisecond)).Run)

	outflowtest.WaitFor(t, 10*time.Second, "the second sender to deliver", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND status = 'delivered'`, id) == 1
	})
	mu.Lock()
	ended, began := firstEnded, secondBegan
	mu.Unlock()
	require.False(t, ended.IsZero(), "the first request ended before the second sender delivered")
	require.True(t, began.After(ended), "the second request began after the first one ended")

	close(hold) // the first sender's timeout is settled now, too late
	outflowtest.WaitFor(t, 10*time.Second, "the late attempt recorded", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_attempts WHERE delivery_id = $1`, id) == 2
	})
	var (
		status   string
		attempts int
		lastErr  *string
	)
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
		`SELECT status, attempts, last_error FROM webhook_deliveries WHERE id = $1`, id).Scan(&status, &attempts, &lastErr))
	require.Equal(t, "delivered", status)
	require.Equal(t, 1, attempts, "the late attempt does not count")
	require.Nil(t, lastErr)
	require.Equal(t, 1, count(t, p, `SELECT count(*) FROM webhook_attempts WHERE delivery_id = $1 AND lease_lost AND status_code IS NULL`, id))
	require.Equal(t, 1, count(t, p, `SELECT count(*) FROM webhook_attempts WHERE delivery_id = $1 AND NOT lease_lost AND status_code = 200`, id))
}

func withPoll(cfg handlers.NotifyConfig, every time.Duration) handlers.NotifyConfig {
	cfg.PollInterval = every
	return cfg
}

// Retry-After (seconds) sets the next attempt, capped by BackoffMax.
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", strings.TrimPrefix(r.URL.Path, "/"))
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	short := record(t, p, merchant(t, p, "Short", srv.URL+"/3"), 1)[0]
	long := record(t, p, merchant(t, p, "Long", srv.URL+"/3600"), 1)[0]
	run(t, newSender(t, p, handlers.NotifyConfig{Backoff: 10 * time.Millisecond, BackoffMax: 4 * time.Second,
		PollInterval: 10 * time.Millisecond}).Run)

	// The wait the sender chose, read while the first retry is scheduled.
	delay := func(id int64) float64 {
		var secs float64
		outflowtest.WaitFor(t, 10*time.Second, "a first attempt settled", func() bool {
			return p.schema.Pool.QueryRow(context.Background(), `
				SELECT extract(epoch FROM d.next_attempt_at - a.attempted_at)::float8
				FROM webhook_deliveries d JOIN webhook_attempts a ON a.delivery_id = d.id
				WHERE d.id = $1 AND d.attempts = 1 AND d.lease_token IS NULL`, id).Scan(&secs) == nil
		})
		return secs
	}
	require.InDelta(t, 3.0, delay(short), 0.001, "Retry-After: 3")
	require.InDelta(t, 4.0, delay(long), 0.001, "Retry-After: 3600, capped by BackoffMax")
}

// A delivery that cannot be signed or whose URL is unusable is dead at its
// first attempt, with the reason.
func TestUndeliverableDeliveriesDieAtOnce(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(srv.Close)
	badSecret := merchant(t, p, "BadSecret", srv.URL)
	_, err := p.schema.Pool.Exec(ctx, `UPDATE merchants SET webhook_secret = 'whsec_%%%' WHERE id = $1`, badSecret.ID)
	require.NoError(t, err)
	want := map[int64]string{record(t, p, badSecret, 1)[0]: "cannot sign: webhook secret is not base64"}
	// Merchants' URLs are validated; a delivery keeps the URL it was
	// recorded with, which older versions did not check.
	for _, u := range []string{"ftp://shop.example/hook", "/relative", "http://[::1"} {
		id := record(t, p, merchant(t, p, u, srv.URL), 1)[0]
		_, err := p.schema.Pool.Exec(ctx, `UPDATE webhook_deliveries SET url = $2 WHERE id = $1`, id, u)
		require.NoError(t, err)
		want[id] = "webhook URL"
	}
	run(t, newSender(t, p, handlers.NotifyConfig{Backoff: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		PollInterval: 10 * time.Millisecond}).Run)
	outflowtest.WaitFor(t, 10*time.Second, "all dead", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'dead'`) == len(want)
	})
	for id, reason := range want {
		var attempts int
		var lastErr string
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT attempts, last_error FROM webhook_deliveries WHERE id = $1`, id).
			Scan(&attempts, &lastErr))
		require.Equal(t, 1, attempts, reason)
		require.Contains(t, lastErr, reason)
	}
}

// Settled deliveries and their attempts go after the retention, in bounded
// batches; pending ones stay whatever their age.
func TestPurgeWebhooks(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	m := merchant(t, p, "M", "https://shop.example/hook")
	_, err := p.schema.Pool.Exec(ctx, `
		WITH d AS (
		    INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, status, created_at)
		    SELECT gen_random_uuid(), $1, 'https://shop.example/hook', 'payment.paid', '{}', s, now() - age
		    FROM (VALUES ('delivered', interval '20 days'), ('dead', interval '20 days'), ('delivered', interval '20 days'),
		                 ('pending', interval '20 days'), ('delivered', interval '1 day')) v(s, age)
		    RETURNING id
		)
		INSERT INTO webhook_attempts (delivery_id, latency_ms) SELECT id, 1 FROM d, generate_series(1, 2)`, m.ID)
	require.NoError(t, err)
	deliveries, attempts, err := handlers.PurgeWebhooks(ctx, p.schema.Pool, time.Now().Add(-15*24*time.Hour), 2)
	require.NoError(t, err)
	require.Equal(t, 3, deliveries)
	require.Equal(t, 6, attempts)
	require.Equal(t, 2, count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' OR created_at > now() - interval '2 days'`))
	require.Equal(t, 2, count(t, p, `SELECT count(*) FROM webhook_deliveries`))
	require.Equal(t, 4, count(t, p, `SELECT count(*) FROM webhook_attempts`))
}

// Merchants that all hang fill the Sender's overall bound, not more.
func TestSenderBoundsRequestsOverall(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	var hanging, maxHanging atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		n := hanging.Add(1)
		for m := maxHanging.Load(); n > m && !maxHanging.CompareAndSwap(m, n); m = maxHanging.Load() {
		}
		defer hanging.Add(-1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	for i := range 3 {
		record(t, p, merchant(t, p, fmt.Sprint("Hangs", i), srv.URL), 3)
	}
	run(t, newSender(t, p, handlers.NotifyConfig{Timeout: time.Minute, PerMerchant: 2, Concurrency: 3,
		PollInterval: 10 * time.Millisecond}).Run)
	t.Cleanup(func() { close(release) }) // before the sender stops and srv closes

	outflowtest.WaitFor(t, 10*time.Second, "the bound filled", func() bool { return hanging.Load() == 3 })
	require.Equal(t, int32(3), maxHanging.Load(), "never more than Concurrency requests")
	require.Equal(t, 6, count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE lease_token IS NULL`),
		"only the deliveries in flight are leased")
}
