package sender_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/sender"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

func TestDeliversSigned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, nil)
	key, err := secretseal.NewKey(make([]byte, secretseal.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	// The endpoint's URL changes after the message was recorded: the
	// delivery goes to the new one.
	id := e.endpoint(ep{url: "http://127.0.0.1:1/old", apiVersion: "2026-01-01"})
	sealed, err := key.Seal(testSecret, id)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []string{uuid.NewString()}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := fanout.Enqueue(context.Background(), e.s.Pool, webhooks.Message{ID: msgs[0], AccountID: "acct",
		EventType: "payment.paid", OccurredAt: time.Now(), Payload: json.RawMessage(`{"n":0}`)}, fanout.Target{}, tp); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE webhook_endpoints SET url = $2, secret = $3 WHERE id = $1`, id, srv.URL+"/hook", sealed)

	render := func(ctx context.Context, m webhooks.Message, v string) ([]byte, error) {
		b, err := webhooks.DefaultRenderer(ctx, m, v)
		return append(b[:len(b)-1], []byte(`,"api_version":"`+v+`"}`)...), err
	}
	reg := prometheus.NewRegistry()
	e.start(fast(sender.Config{SecretKey: key, Render: render, Registerer: reg}))
	outflowtest.WaitFor(t, 5*time.Second, "delivered", func() bool { return e.delivered(id) == 1 })
	outflowtest.WaitFor(t, 5*time.Second, "counted", func() bool {
		return counter(reg, sender.MetricAttempts, "delivered") == 1
	})

	r := srv.requests()[0]
	if err := signing.Verify(testSecret, r.header, r.body, time.Now(), 0); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if got := r.header.Get("traceparent"); !strings.Contains(got, "4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("traceparent %q does not continue the recording trace", got)
	}
	for h, want := range map[string]string{"webhook-id": msgs[0], "Content-Type": "application/json",
		"User-Agent": "Outflow-Webhooks/1"} {
		if got := r.header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	var body struct {
		Type       string          `json:"type"`
		Data       json.RawMessage `json:"data"`
		APIVersion string          `json:"api_version"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || body.Type != "payment.paid" || string(body.Data) != `{"n":0}` ||
		body.APIVersion != "2026-01-01" {
		t.Fatalf("body %s (%v)", r.body, err)
	}
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts WHERE endpoint_id = $1 AND status_code = 200
		AND latency_ms > 0 AND NOT lease_lost`, id); n != 1 {
		t.Fatalf("attempts recorded: %d", n)
	}
}

func TestRotationGraceSignsWithBoth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, nil)
	newSecret, _ := signing.NewSecret()
	inGrace := e.endpoint(ep{account: "a", url: srv.URL, secret: newSecret, prevSecret: testSecret,
		prevExpires: time.Now().Add(time.Hour)})
	expired := e.endpoint(ep{account: "b", url: srv.URL, secret: newSecret, prevSecret: testSecret,
		prevExpires: time.Now().Add(-time.Second)})
	graceMsg := e.enqueue("a", "x", 1)[0]
	e.enqueue("b", "x", 1)
	e.start(fast(sender.Config{}))
	outflowtest.WaitFor(t, 5*time.Second, "delivered", func() bool { return e.delivered(inGrace)+e.delivered(expired) == 2 })
	for _, r := range srv.requests() {
		if err := signing.Verify(newSecret, r.header, r.body, time.Now(), 0); err != nil {
			t.Errorf("new secret: %v", err)
		}
		err := signing.Verify(testSecret, r.header, r.body, time.Now(), 0)
		if r.header.Get("webhook-id") == graceMsg {
			if err != nil {
				t.Errorf("previous secret in its grace period: %v", err)
			}
		} else if err == nil {
			t.Errorf("previous secret past its grace period still signs")
		}
	}
}

func TestRetryScheduleAndRetryAfter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch n {
		case 1:
			w.Header().Set("Retry-After", "1") // longer than the step: replaces it
			w.WriteHeader(http.StatusInternalServerError)
		case 2:
			w.Header().Set("Retry-After", "3600") // capped at the longest step
			w.WriteHeader(http.StatusInternalServerError)
		case 3:
			w.WriteHeader(http.StatusBadGateway) // the schedule's step
		}
	})
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 1)
	e.start(fast(sender.Config{Schedule: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond,
		300 * time.Millisecond, 1500 * time.Millisecond}}))
	outflowtest.WaitFor(t, 10*time.Second, "delivered", func() bool { return e.delivered(id) == 1 })
	r := srv.requests()
	if len(r) != 4 {
		t.Fatalf("%d requests, want 4", len(r))
	}
	gaps := []time.Duration{r[1].at.Sub(r[0].at), r[2].at.Sub(r[1].at), r[3].at.Sub(r[2].at)}
	if gaps[0] < time.Second || gaps[0] > 5*time.Second {
		t.Errorf("after Retry-After: 1, the retry came after %s", gaps[0])
	}
	if gaps[1] < 1500*time.Millisecond || gaps[1] > 5*time.Second {
		t.Errorf("after Retry-After: 3600, the retry came after %s, want the longest step (1.5s)", gaps[1])
	}
	if gaps[2] < 300*time.Millisecond || gaps[2] >= 1450*time.Millisecond {
		t.Errorf("after the third failure, the retry came after %s, want the third step (300ms)", gaps[2])
	}
}

func TestFailsAfterTheLastStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusServiceUnavailable) })
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 1)
	e.start(fast(sender.Config{Schedule: []time.Duration{20 * time.Millisecond, 20 * time.Millisecond}}))
	outflowtest.WaitFor(t, 5*time.Second, "failed", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'failed'
			AND attempts = 3 AND last_error = 'HTTP 503' AND settled_at IS NOT NULL`, id) == 1
	})
	if srv.count() != 3 {
		t.Fatalf("%d requests, want 3 (one, then one per step)", srv.count())
	}
}

func TestClientErrorFailsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadRequest) })
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 1)
	e.start(fast(sender.Config{}))
	outflowtest.WaitFor(t, 5*time.Second, "failed", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'failed'
			AND attempts = 1 AND last_error = 'HTTP 400'`, id) == 1
	})
}

func TestRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	target := newServer(t, nil)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Redirect(w, r, target.URL+"/elsewhere?token=abc", http.StatusFound)
	})
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 1)
	e.start(fast(sender.Config{Schedule: []time.Duration{time.Hour}}))
	outflowtest.WaitFor(t, 5*time.Second, "attempted", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts WHERE endpoint_id = $1 AND status_code = 302`, id) == 1
	})
	var lastErr string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT last_error FROM webhook_endpoint_deliveries
		WHERE endpoint_id = $1 AND status = 'pending'`, id).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "redirects are not followed") || strings.Contains(lastErr, "abc") {
		t.Errorf("last_error %q", lastErr)
	}
	if target.count() != 0 {
		t.Fatalf("the redirect was followed")
	}
}

// loopback answers every name with 127.0.0.1.
type loopback struct{}

func (loopback) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

func TestGuardRefusesPrivateAddresses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, nil)
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	// A public-looking name that resolves to a loopback address, and a
	// plain-http URL to one.
	named := e.endpoint(ep{account: "a", url: "https://hooks.example.com:" + port + "/x"})
	direct := e.endpoint(ep{account: "b", url: srv.URL})
	e.enqueue("a", "x", 1)
	e.enqueue("b", "x", 1)
	c := fast(sender.Config{Resolver: loopback{}})
	c.AllowPrivate = false
	e.start(c)
	outflowtest.WaitFor(t, 5*time.Second, "refused", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'failed'`) == 2
	})
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts WHERE endpoint_id = $1 AND error = 'blocked: private address'`, named); n != 1 {
		t.Errorf("attempts blocked at dial: %d", n)
	}
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND last_error LIKE 'webhook URL refused%'`, direct); n != 1 {
		t.Errorf("URL refused: %d", n)
	}
	if srv.count() != 0 {
		t.Fatalf("%d requests reached the private address", srv.count())
	}
}

func TestCircuitOpensHoldsProbesAndCloses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mode atomic.Int32 // 0: fail; 1: block, then succeed
	release := make(chan struct{})
	var inflight, maxInflight atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if mode.Load() == 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if n := inflight.Add(1); n > maxInflight.Load() {
			maxInflight.Store(n)
		}
		defer inflight.Add(-1)
		_ = blockUntil(release, r)
	})
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 4)
	// Failed deliveries wait an hour on the schedule: only the circuit's
	// closing can bring them back soon.
	e.start(fast(sender.Config{CircuitFailures: 3, CircuitCooldown: 800 * time.Millisecond, PerEndpoint: 4,
		Schedule: []time.Duration{time.Hour}}))
	var end time.Time
	outflowtest.WaitFor(t, 5*time.Second, "the circuit open", func() bool {
		err := e.s.Pool.QueryRow(context.Background(), `SELECT e.circuit_open_until FROM webhook_endpoints e
			WHERE e.id = $1 AND e.circuit_open_until IS NOT NULL AND e.consecutive_failures >= 3
			  AND NOT EXISTS (SELECT 1 FROM webhook_endpoint_deliveries d WHERE d.endpoint_id = e.id AND d.lease_token IS NOT NULL)`,
			id).Scan(&end)
		return err == nil
	})
	held := srv.count()
	mode.Store(1)
	e.enqueue("acct", "x", 2) // recorded due at the circuit's end
	outflowtest.WaitFor(t, 5*time.Second, "the probe", func() bool { return srv.count() == held+1 })
	if at := srv.requests()[held].at; at.Before(end.Add(-20 * time.Millisecond)) {
		t.Fatalf("a request came %s before the circuit's end", end.Sub(at))
	}
	// While the probe hangs, nothing else goes: a few poll rounds pass.
	time.Sleep(300 * time.Millisecond)
	if srv.count() != held+1 || maxInflight.Load() != 1 {
		t.Fatalf("%d requests after the probe, %d in flight at most: want the probe alone", srv.count()-held-1, maxInflight.Load())
	}
	close(release)
	outflowtest.WaitFor(t, 5*time.Second, "the backlog delivered", func() bool { return e.delivered(id) == 6 })
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND consecutive_failures = 0
		AND failing_since IS NULL AND circuit_open_until IS NULL`, id); n != 1 {
		t.Fatal("the circuit did not close")
	}
}

// A healthy endpoint's deliveries write no new version of its row. (Each
// delivery's insert still locks it, KEY SHARE, for its foreign key.)
func TestHealthyDeliveriesDoNotWriteTheEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, nil)
	id := e.endpoint(ep{url: srv.URL})
	var before string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT xmin::text FROM webhook_endpoints WHERE id = $1`, id).Scan(&before); err != nil {
		t.Fatal(err)
	}
	e.enqueue("acct", "x", 5)
	e.start(fast(sender.Config{}))
	outflowtest.WaitFor(t, 10*time.Second, "delivered", func() bool { return e.delivered(id) == 5 })
	var after string
	if err := e.s.Pool.QueryRow(context.Background(), `SELECT xmin::text FROM webhook_endpoints WHERE id = $1`, id).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("the endpoint's row was written by the settles (xmin %s, was %s)", after, before)
	}
}

// A failing endpoint's backlog waits for its retry's outcome outside the
// due scan, new deliveries to it too; the retry's success sends them all.
func TestFailingEndpointsBacklogIsHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 5)
	// One request at a time: the first fails, and its retry comes in 2 s.
	// Nothing else goes to the endpoint before it.
	e.start(fast(sender.Config{PerEndpoint: 1, Schedule: []time.Duration{2 * time.Second}}))
	outflowtest.WaitFor(t, 5*time.Second, "the first attempt failed", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts WHERE status_code = 500`) == 1
	})
	e.enqueue("acct", "x", 1)
	// The retry is due in 2 s; the other five wait past it (for its
	// outcome, at most CircuitCooldownMax, an hour, past it).
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'pending'
		AND attempts = 0 AND next_attempt_at > now() + interval '30 minutes'`, id); n != 5 {
		t.Fatalf("%d deliveries held, want the 5 not tried", n)
	}
	// All six are in the suspect lane, out of the healthy lane's scan.
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND suspect`, id); n != 6 {
		t.Fatalf("%d deliveries in the suspect lane, want 6", n)
	}
	if srv.count() != 1 {
		t.Fatalf("%d requests before the retry, want 1", srv.count())
	}
	outflowtest.WaitFor(t, 10*time.Second, "all delivered after the retry's success", func() bool { return e.delivered(id) == 6 })
	if r := srv.requests(); r[1].at.Sub(r[0].at) < 1500*time.Millisecond {
		t.Fatalf("the second request came %s after the failure, before the retry was due", r[1].at.Sub(r[0].at))
	}
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND held_until IS NULL AND consecutive_failures = 0`, id); n != 1 {
		t.Fatal("the endpoint is still held after a success")
	}
}

func TestRetryAfterOpensTheCircuitAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 3)
	e.start(fast(sender.Config{CircuitFailures: 5, PerEndpoint: 1, Schedule: []time.Duration{10 * time.Millisecond, time.Hour}}))
	outflowtest.WaitFor(t, 5*time.Second, "the circuit open", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND consecutive_failures = 1
			AND circuit_open_until > now() + interval '1 second'`, id) == 1
	})
	// The other deliveries wait for the circuit's end.
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1
		AND next_attempt_at > now() + interval '1 second'`, id); n != 3 {
		t.Fatalf("%d deliveries held back, want 3", n)
	}
	if srv.count() != 1 {
		t.Fatalf("%d requests, want 1", srv.count())
	}
}

func TestFailedProbeReopensLonger(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusInternalServerError) })
	// Circuits that ended: the next request is a probe.
	second := e.endpoint(ep{account: "a", url: srv.URL, failures: 3})
	capped := e.endpoint(ep{account: "b", url: srv.URL, failures: 20})
	e.exec(`UPDATE webhook_endpoints SET circuit_open_until = now() - interval '1 second'`)
	e.enqueue("a", "x", 1)
	e.enqueue("b", "x", 1)
	e.start(fast(sender.Config{CircuitFailures: 3, CircuitCooldown: 10 * time.Second, CircuitCooldownMax: 30 * time.Second}))
	outflowtest.WaitFor(t, 5*time.Second, "the probes failed", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts`) == 2
	})
	for id, want := range map[string]float64{second: 20, capped: 30} { // 10 s doubled once; at most 30 s
		var secs float64
		if err := e.s.Pool.QueryRow(context.Background(), `SELECT extract(epoch FROM circuit_open_until - now())
			FROM webhook_endpoints WHERE id = $1`, id).Scan(&secs); err != nil {
			t.Fatal(err)
		}
		if secs > want || secs < want-3 {
			t.Errorf("circuit reopened for %.1fs, want %.0fs", secs, want)
		}
	}
}

func TestDisablesAFailingEndpointWithANotice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	failing := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) })
	other := newServer(t, nil)
	bad := e.endpoint(ep{url: failing.URL})
	good := e.endpoint(ep{url: other.URL})
	e.enqueue("acct", "payment.paid", 2)
	steps := make([]time.Duration, 100)
	for i := range steps {
		steps[i] = 50 * time.Millisecond
	}
	e.start(fast(sender.Config{DisableAfter: time.Second, Schedule: steps, PerEndpoint: 1}))
	outflowtest.WaitFor(t, 10*time.Second, "disabled", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND disabled_reason = 'failing'
			AND disabled_at >= failing_since + interval '1 second'`, bad) == 1
	})
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1
		AND (status <> 'failed' OR last_error <> 'endpoint disabled')`, bad); n != 0 {
		t.Fatalf("%d deliveries of the disabled endpoint not failed 'endpoint disabled'", n)
	}
	outflowtest.WaitFor(t, 5*time.Second, "the notice", func() bool { return other.count() == 3 })
	var notice struct {
		Type string                    `json:"type"`
		Data webhooks.EndpointDisabled `json:"data"`
	}
	last := other.requests()[2]
	if err := json.Unmarshal(last.body, &notice); err != nil || notice.Type != webhooks.EventEndpointDisabled ||
		notice.Data.EndpointID != bad || notice.Data.URL != failing.URL || notice.Data.LastError != "HTTP 502" {
		t.Fatalf("notice %s (%v)", last.body, err)
	}
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries d JOIN webhook_messages m ON m.id = d.message_id
		WHERE d.endpoint_id = $1 AND m.event_type = 'endpoint.disabled'`, bad); n != 0 {
		t.Fatal("the disabled endpoint got its own notice")
	}
	_ = good
	for _, r := range failing.requests() {
		if strings.Contains(string(r.body), "endpoint.disabled") {
			t.Fatal("the disabled endpoint was sent the notice")
		}
	}
}

func TestDisabledAndOpenEndpointsNeverLeased(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	off := newServer(t, nil)
	on := newServer(t, nil)
	disabled := e.endpoint(ep{account: "a", url: off.URL})
	open := e.endpoint(ep{account: "c", url: off.URL})
	e.enqueue("a", "x", 3)
	e.enqueue("c", "x", 3)
	// Disabled, and circuit open, after their messages were recorded: their
	// deliveries are pending, due (as a resend would make them), and older
	// than the healthy endpoint's.
	e.exec(`UPDATE webhook_endpoints SET disabled_at = now(), disabled_reason = 'manual' WHERE id = $1`, disabled)
	e.exec(`UPDATE webhook_endpoints SET circuit_open_until = now() + interval '1 hour', consecutive_failures = 5,
		failing_since = now() WHERE id = $1`, open)
	enabled := e.endpoint(ep{account: "b", url: on.URL})
	e.enqueue("b", "x", 3)
	e.start(fast(sender.Config{Concurrency: 1}))
	outflowtest.WaitFor(t, 5*time.Second, "delivered", func() bool { return e.delivered(enabled) == 3 })
	time.Sleep(100 * time.Millisecond) // a few more poll rounds
	if off.count() != 0 || e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id IN ($1, $2)
		AND (attempts > 0 OR lease_token IS NOT NULL)`, disabled, open) != 0 {
		t.Fatalf("a disabled or circuit-open endpoint's delivery was leased (%d requests)", off.count())
	}
}

func TestSuspectLaneKeepsHealthyEndpointsGoing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	slow := newStuckServer(t)
	healthy := newServer(t, nil)
	e.endpoint(ep{account: "slow", url: slow.URL, failures: 1}) // its last attempt failed
	healthyID := e.endpoint(ep{account: "ok", url: healthy.URL})
	e.enqueue("slow", "x", 8) // due first
	e.enqueue("ok", "x", 8)
	e.start(fast(sender.Config{Concurrency: 4, PerEndpoint: 4, SuspectConcurrency: 1, Timeout: 30 * time.Second}))
	outflowtest.WaitFor(t, 5*time.Second, "the healthy endpoint's deliveries", func() bool { return e.delivered(healthyID) == 8 })
	if slow.count() != 1 {
		t.Fatalf("%d requests stuck at the slow endpoint, want 1 (the suspect lane's)", slow.count())
	}
}

func TestSlowRequestsMoveToTheSuspectLane(t *testing.T) {
	t.Parallel()
	e, slow, healthyID := slowBesideHealthy(t)
	e.enqueue("slow", "x", 4) // due first: its first wave takes every slot
	e.enqueue("ok", "x", 8)
	e.start(fast(sender.Config{Concurrency: 4, PerEndpoint: 4, SuspectConcurrency: 1, Timeout: 30 * time.Second,
		SlowAfter: 200 * time.Millisecond}))
	outflowtest.WaitFor(t, 5*time.Second, "the healthy endpoint's deliveries", func() bool { return e.delivered(healthyID) == 8 })
	if slow.count() != 4 {
		t.Fatalf("%d requests to the slow endpoint, want its first wave (4) only", slow.count())
	}
}

// When the slots run short, a request slower than a tenth of SlowAfter
// gives its slot up without waiting for SlowAfter.
func TestPressureMovesSlowRequestsSooner(t *testing.T) {
	t.Parallel()
	e, slow, healthyID := slowBesideHealthy(t)
	e.enqueue("slow", "x", 4) // its first wave takes every slot
	e.start(fast(sender.Config{Concurrency: 4, PerEndpoint: 4, SuspectConcurrency: 1, Timeout: 60 * time.Second,
		SlowAfter: 30 * time.Second}))
	outflowtest.WaitFor(t, 5*time.Second, "the slow requests", func() bool { return slow.count() == 4 })
	// Every slot is taken: the healthy deliveries get one once the slow
	// requests have run a tenth of SlowAfter (3 s), not SlowAfter (30 s).
	e.enqueue("ok", "x", 8)
	outflowtest.WaitFor(t, 15*time.Second, "the healthy endpoint's deliveries", func() bool { return e.delivered(healthyID) == 8 })
}

func TestSlowEndpointIsSuspect(t *testing.T) {
	t.Parallel()
	e, slow, healthyID := slowBesideHealthy(t)
	e.enqueue("slow", "x", 2) // below its bound of 4
	const slowAfter = 200 * time.Millisecond
	e.start(fast(sender.Config{Concurrency: 4, PerEndpoint: 4, SuspectConcurrency: 1, Timeout: 30 * time.Second,
		SlowAfter: slowAfter}))
	outflowtest.WaitFor(t, 5*time.Second, "the slow requests", func() bool { return slow.count() == 2 })
	time.Sleep(slowAfter + 100*time.Millisecond) // they are slow now
	// The endpoint has free slots of its own, but its requests are slow:
	// it is suspect, and the suspect lane is full.
	e.enqueue("slow", "x", 2)
	e.enqueue("ok", "x", 8)
	outflowtest.WaitFor(t, 5*time.Second, "the healthy endpoint's deliveries", func() bool { return e.delivered(healthyID) == 8 })
	time.Sleep(100 * time.Millisecond) // a few more poll rounds
	if slow.count() != 2 {
		t.Fatalf("%d requests to the slow endpoint, want 2", slow.count())
	}
}

// rateLimited is an endpoint with a rate_limit of 2 (a bucket of 2,
// refilled at 2/s) and six deliveries queued for it.
func rateLimited(t *testing.T) (*env, *server, string) {
	e := newEnv(t)
	srv := newServer(t, nil)
	id := e.endpoint(ep{url: srv.URL, rateLimit: 2})
	e.enqueue("acct", "x", 6)
	return e, srv, id
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	e, srv, id := rateLimited(t)
	e.start(fast(sender.Config{}))
	outflowtest.WaitFor(t, 10*time.Second, "delivered", func() bool { return e.delivered(id) == 6 })
	r := srv.requests()
	// A bucket of 2, refilled at 2/s: the last 4 take 2 s.
	if d := r[5].at.Sub(r[0].at); d < 1500*time.Millisecond {
		t.Fatalf("6 requests in %s at 2/s", d)
	}
	for i := 4; i < len(r); i++ {
		if d := r[i].at.Sub(r[i-4].at); d < 900*time.Millisecond {
			t.Fatalf("requests %d to %d within %s", i-4, i, d)
		}
	}
}

func TestLeaseLostRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, nil)
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 1)
	s := sender.New(e.s.Pool, fast(sender.Config{}))
	sender.SetSettleHook(s, func(delivery int64) {
		// Another sender took the delivery meanwhile (its lease lapsed).
		e.exec(`UPDATE webhook_endpoint_deliveries SET lease_token = gen_random_uuid(),
			next_attempt_at = now() + interval '1 hour' WHERE id = $1`, delivery)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	outflowtest.WaitFor(t, 5*time.Second, "the attempt recorded", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts WHERE endpoint_id = $1 AND lease_lost AND status_code = 200`, id) == 1
	})
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'pending'
		AND attempts = 0 AND lease_token IS NOT NULL`, id); n != 1 {
		t.Fatal("a lost lease's result changed the delivery")
	}
}

func TestResponseBodyBoundedAndRedacted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, `{"error":"bad","api_key":"sk_live_abcdef","auth":"Bearer eyJhbGciOi.x.y","pad":"%s`,
			strings.Repeat("ü", 3000))
		w.Write([]byte{0xff, 0xfe})
	})
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 1)
	e.start(fast(sender.Config{}))
	var body string
	outflowtest.WaitFor(t, 5*time.Second, "the attempt", func() bool {
		return e.s.Pool.QueryRow(context.Background(), `SELECT response_body FROM webhook_endpoint_attempts
			WHERE endpoint_id = $1`, id).Scan(&body) == nil
	})
	if len(body) > 1024 || len(body) < 1000 || !utf8.ValidString(body) {
		t.Fatalf("body of %d bytes, valid UTF-8 %v", len(body), utf8.ValidString(body))
	}
	if strings.Contains(body, "sk_live") || strings.Contains(body, "eyJ") || !strings.HasPrefix(body, `{"error":"bad","api_key":"xxxxx"`) {
		t.Fatalf("body not redacted: %.120s", body)
	}
}

func TestShutdownReleasesLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newStuckServer(t)
	id := e.endpoint(ep{url: srv.URL})
	e.enqueue("acct", "x", 2)
	_, stop := e.start(fast(sender.Config{Timeout: 30 * time.Second}))
	outflowtest.WaitFor(t, 5*time.Second, "the requests", func() bool { return srv.count() == 2 })
	stop()
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'pending'
		AND attempts = 0 AND lease_token IS NULL AND next_attempt_at <= now()`, id); n != 2 {
		t.Fatalf("%d of 2 leases released", n)
	}
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts`); n != 0 {
		t.Fatalf("%d attempts cut short by the shutdown recorded", n)
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	err := sender.New(nil, sender.Config{Concurrency: -1}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Concurrency") || !strings.Contains(err.Error(), "pool") {
		t.Fatalf("Run = %v", err)
	}
}

// counter is the value of the counter of the family name with the label
// value v, registered on reg.
func counter(reg *prometheus.Registry, name, v string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == v {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

func TestLogsHoldNoURLSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var buf outflowtest.LogBuffer
	id := e.endpoint(ep{url: "http://127.0.0.1:1/hook?token=tok_secret_123"}) // nothing listens
	e.enqueue("acct", "x", 1)
	e.start(fast(sender.Config{Schedule: []time.Duration{10 * time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(&buf, nil))}))
	outflowtest.WaitFor(t, 5*time.Second, "failed", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'failed'
			AND last_error = 'connection refused or unreachable'`, id) == 1
	})
	outflowtest.WaitFor(t, 5*time.Second, "logged", func() bool { return strings.Contains(buf.String(), "failed") })
	if strings.Contains(buf.String(), "tok_secret_123") {
		t.Fatalf("the log holds the URL's token: %s", buf.String())
	}
}

func TestUnsendableDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := newServer(t, nil)
	key, _ := secretseal.NewKey(make([]byte, secretseal.KeySize))
	// A body that cannot be rendered fails at once; a secret sealed with
	// a key the Sender lacks is the operator's to fix: retried.
	unrenderable := e.endpoint(ep{account: "a", url: srv.URL, apiVersion: "broken"})
	sealedID := e.endpoint(ep{account: "b", url: srv.URL})
	sealed, _ := key.Seal(testSecret, sealedID)
	e.exec(`UPDATE webhook_endpoints SET secret = $2 WHERE id = $1`, sealedID, sealed)
	e.enqueue("a", "x", 1)
	e.enqueue("b", "x", 1)
	render := func(ctx context.Context, m webhooks.Message, v string) ([]byte, error) {
		if v == "broken" {
			return nil, fmt.Errorf("no converter to %q", v)
		}
		return webhooks.DefaultRenderer(ctx, m, v)
	}
	e.start(fast(sender.Config{Render: render, Schedule: []time.Duration{time.Hour}}))
	outflowtest.WaitFor(t, 5*time.Second, "both attempted", func() bool {
		return e.intQ(`SELECT count(*) FROM webhook_endpoint_attempts`) == 2
	})
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'failed'
		AND last_error LIKE 'render: %'`, unrenderable); n != 1 {
		t.Errorf("unrenderable delivery not failed")
	}
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND status = 'pending'
		AND last_error LIKE 'cannot sign: %'`, sealedID); n != 1 {
		t.Errorf("delivery without the secret key not retried")
	}
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoints WHERE consecutive_failures > 0`); n != 0 {
		t.Errorf("a delivery's own failure counted against its endpoint's health")
	}
	if srv.count() != 0 {
		t.Fatalf("%d requests", srv.count())
	}
}

// A lease that waits (here for a lock the test holds on the endpoints)
// spends its tokens when its requests go out, not when it began. Spent as
// of its start, the tokens that came in while it waited were counted again
// by the next lease: the endpoint got twice its burst at once.
func TestRateLimitHoldsThroughASlowLease(t *testing.T) {
	t.Parallel()
	e, srv, id := rateLimited(t)
	ctx := context.Background()
	lock, err := e.s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE webhook_endpoints IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	e.start(fast(sender.Config{}))
	// The slow lease this test is about: waiting on the lock for as long
	// as the bucket takes to refill whole (2 tokens at 2/s).
	outflowtest.WaitFor(t, 10*time.Second, "the lease waiting 1 s for the endpoints' lock", func() bool {
		return e.intQ(`SELECT count(*) FROM pg_stat_activity a
			WHERE clock_timestamp() - a.query_start >= interval '1 second'
			  AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.relation = 'webhook_endpoints'::regclass AND NOT l.granted)`) > 0
	})
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	outflowtest.WaitFor(t, 10*time.Second, "delivered", func() bool { return e.delivered(id) == 6 })
	r := srv.requests()
	// A bucket of 2 refilled at 2/s: any five requests span at least 1.5 s
	// (checked with room for a loaded machine); twice the burst at once
	// puts five within 0.5 s.
	for i := 4; i < len(r); i++ {
		if d := r[i].at.Sub(r[i-4].at); d < time.Second {
			t.Fatalf("requests %d to %d within %s: more than the bucket lets through", i-4, i, d)
		}
	}
}
