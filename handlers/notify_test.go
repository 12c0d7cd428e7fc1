package handlers_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/consumer"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

// verify is the reference algorithm, written from the specification, as a
// merchant would run it.
func verify(secret string, h http.Header, body []byte) bool {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)))
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Fields(h.Get("webhook-signature")) {
		if v, sig, ok := strings.Cut(s, ","); ok && v == "v1" && hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}

// fastSchedule retries at once, a few times: the tests' sender.
func fastSchedule(cfg sender.Config) sender.Config {
	cfg.Schedule = []time.Duration{10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond}
	cfg.Jitter = -1
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	return cfg
}

// A merchant's paid payment reaches its webhook_url as it did before the
// webhook package: one webhook whose id is the event's message id, body
// {"type", "timestamp", "data"}, signed with the merchant's secret;
// retried on 5xx, 429 and timeouts; a 410 fails at once; every attempt is
// recorded against the endpoint migration 00034 made (id = merchant id).
func TestMerchantWebhooksRetriedAndFailed(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	var calls atomic.Int32
	var secret atomic.Value
	var badSignature atomic.Bool
	bodies := make(chan http.Header, 10)
	var mu sync.Mutex
	var lastBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if s, ok := secret.Load().(string); ok && strings.HasSuffix(r.URL.Path, "/flaky") && !verify(s, r.Header, body) {
			badSignature.Store(true)
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/flaky"):
			mu.Lock()
			lastBody = body
			mu.Unlock()
			switch calls.Add(1) {
			case 1:
				w.WriteHeader(http.StatusInternalServerError)
			case 2:
				w.WriteHeader(http.StatusTooManyRequests)
			case 3:
				time.Sleep(1500 * time.Millisecond) // past the sender's timeout
			default:
				bodies <- r.Header
				w.WriteHeader(http.StatusNoContent)
			}
		case strings.HasSuffix(r.URL.Path, "/gone"):
			w.WriteHeader(http.StatusGone)
		}
	}))
	t.Cleanup(srv.Close)

	flaky := merchant(t, p, "Flaky", srv.URL+"/flaky")
	secret.Store(flaky.WebhookSecret)
	gone := merchant(t, p, "Gone", srv.URL+"/gone")
	p.runForwarder(t, 0)
	run(t, consumerWorker(t, p, p.schema.Pool, handlers.NotifyConfig{}).Run)
	// A timeout a loaded machine's answers stay under.
	run(t, newWebhookSender(p, fastSchedule(sender.Config{Timeout: time.Second})).Run)
	paid(t, p, flaky.ID)
	paid(t, p, gone.ID)

	status := func(endpointID string) (string, int) {
		var s string
		var n int
		err := p.schema.Pool.QueryRow(ctx, `
			SELECT d.status, (SELECT count(*) FROM webhook_endpoint_attempts a WHERE a.delivery_id = d.id)
			FROM webhook_endpoint_deliveries d WHERE endpoint_id = $1`, endpointID).Scan(&s, &n)
		if err != nil {
			return "", 0
		}
		return s, n
	}
	outflowtest.WaitFor(t, 30*time.Second, "the flaky merchant served", func() bool { s, _ := status(flaky.ID); return s == "delivered" })
	_, attempts := status(flaky.ID)
	require.Equal(t, 4, attempts, "500, 429 and a timeout were retried")
	outflowtest.WaitFor(t, 30*time.Second, "the gone merchant given up", func() bool { s, _ := status(gone.ID); return s == "failed" })
	_, attempts = status(gone.ID)
	require.Equal(t, 1, attempts, "a 410 is not retried")
	require.False(t, badSignature.Load(), "every delivery verifies with the merchant's secret")

	// What the merchant sees is what the earlier releases sent.
	h := <-bodies
	var paidID string
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT o.message_id::text FROM outbox o
		WHERE o.event_type = 'payment.paid' AND o.payload::jsonb->>'merchant_id' = $1`, flaky.ID).Scan(&paidID))
	require.Equal(t, paidID, h.Get("webhook-id"), "webhook-id = the event's message id")
	mu.Lock()
	defer mu.Unlock()
	var body map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(lastBody, &body))
	require.ElementsMatch(t, []string{"type", "timestamp", "data"}, keys(body))
	require.JSONEq(t, `"payment.paid"`, string(body["type"]))
	var data paymentevents.Paid
	require.NoError(t, json.Unmarshal(body["data"], &data))
	require.Equal(t, flaky.ID, data.MerchantID)
}

func keys(m map[string]json.RawMessage) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// consumerWorker is a worker of only NotifyMerchant on pool (the consumer's
// database), reading p's streams.
func consumerWorker(t *testing.T, p *pipeline, pool *pgxpool.Pool, cfg handlers.NotifyConfig) *consumer.Worker {
	t.Helper()
	reg := events.NewRegistry()
	require.NoError(t, paymentevents.Register(reg))
	w, err := consumer.NewWorker(consumer.WorkerConfig{
		Pool: pool, Broker: p.workerBackend(t), Registry: reg, ClaimIdle: time.Second, Logger: quiet,
		Idempotency: idempotency.Config{MaxAttempts: 2, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond,
			RetryPollInterval: 10 * time.Millisecond},
	})
	require.NoError(t, err)
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	require.NoError(t, w.Add(handlers.NotifyMerchant(pool, cfg)))
	return w
}

// paid creates a payment of the merchant and pays it; it returns the
// payment's id.
func paid(t *testing.T, p *pipeline, merchantID string) string {
	t.Helper()
	ctx := context.Background()
	pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: merchantID, Amount: 100, Currency: "EUR"})
	require.NoError(t, err)
	_, err = p.svc.Pay(ctx, pay.ID)
	require.NoError(t, err)
	return pay.ID
}

// A payment of a merchant the consumer's database does not know is not
// dropped: the message is retried, then dead-lettered naming the merchant.
func TestUnknownMerchantIsDeadLettered(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	consumerDB := outflowtest.NewSchema(t, appmigrations.Sets()...) // has no merchants
	m := merchant(t, p, "Shop", "https://shop.example/hook")
	paid(t, p, m.ID)
	p.runForwarder(t, 0)
	run(t, consumerWorker(t, p, consumerDB.Pool, handlers.NotifyConfig{}).Run)

	var dl idempotency.DeadLetter
	outflowtest.WaitFor(t, 30*time.Second, "the payment dead-lettered", func() bool {
		dls, err := idempotency.ListDeadLetters(context.Background(), consumerDB.Pool, "notify-merchant", 10)
		require.NoError(t, err)
		if len(dls) == 1 && dls[0].Status == "dead" {
			dl = dls[0]
			return true
		}
		return false
	})
	require.Equal(t, paymentevents.PaidType, dl.EventType)
	require.Contains(t, dl.Error, "merchant "+m.ID)
	require.Contains(t, dl.Error, handlers.ErrUnknownMerchant.Error())
	var n int
	require.NoError(t, consumerDB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_messages`).Scan(&n))
	require.Zero(t, n)
}

// The handler wakes an in-process sender once its delivery committed: the
// webhook goes out without waiting for the sender's poll (an hour here).
func TestHandledDeliveryWakesTheSender(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("webhook-id")
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	m := merchant(t, p, "Shop", srv.URL)
	snd := newWebhookSender(p, sender.Config{PollInterval: time.Hour})
	run(t, snd.Run) // its first round, at start, finds nothing
	p.runForwarder(t, 0)
	run(t, consumerWorker(t, p, p.schema.Pool, handlers.NotifyConfig{Wake: snd.Wake}).Run)
	paid(t, p, m.ID)

	select {
	case id := <-got:
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM outbox WHERE message_id = $1 AND event_type = 'payment.paid'`, id).Scan(&n))
		require.Equal(t, 1, n)
	case <-time.After(30 * time.Second):
		t.Fatal("the webhook did not go out")
	}
}

// receipt is one webhook an endpoint received.
type receipt struct {
	id, typ string
	header  http.Header
	body    []byte
}

// A merchant with two endpoints of its own, each with its filter: a paid
// and refunded payment reaches each endpoint with what it subscribed to
// and nothing else, each signed with its own secret (and not the other's).
func TestMerchantEndpointsGetWhatTheySubscribedTo(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	var mu sync.Mutex
	got := map[string][]receipt{} // path -> receipts
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b struct{ Type string }
		_ = json.Unmarshal(body, &b)
		mu.Lock()
		got[r.URL.Path] = append(got[r.URL.Path], receipt{r.Header.Get("webhook-id"), b.Type, r.Header.Clone(), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	m := merchant(t, p, "Shop", srv.URL+"/legacy")
	store, err := p.svc.WebhookEndpoints()
	require.NoError(t, err)
	// The endpoint 00034's trigger made for webhook_url goes: the
	// merchant now manages its endpoints itself.
	require.NoError(t, store.Delete(ctx, p.schema.Pool, m.ID, m.ID))
	paidEP, err := store.Create(ctx, p.schema.Pool, m.ID, endpoints.NewEndpoint{URL: srv.URL + "/paid", EventTypes: []string{"payment.paid"}})
	require.NoError(t, err)
	refundEP, err := store.Create(ctx, p.schema.Pool, m.ID, endpoints.NewEndpoint{URL: srv.URL + "/refunds", EventTypes: []string{"payment.refunded"}})
	require.NoError(t, err)
	require.NotEqual(t, paidEP.Secret, refundEP.Secret)

	p.runForwarder(t, 0)
	snd := newWebhookSender(p, sender.Config{})
	run(t, snd.Run)
	run(t, consumerWorker(t, p, p.schema.Pool, handlers.NotifyConfig{Wake: snd.Wake}).Run)
	payID := paid(t, p, m.ID)
	_, err = p.svc.Refund(ctx, payID, nil)
	require.NoError(t, err)

	want := p.messageIDs(t, paymentevents.PaidType, paymentevents.RefundedType)
	require.Len(t, want, 2)
	outflowtest.WaitFor(t, 30*time.Second, "each endpoint's webhook", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["/paid"]) >= 1 && len(got["/refunds"]) >= 1
	})
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, got["/legacy"], "the deleted endpoint gets nothing")
	for path, c := range map[string]struct {
		typ           string
		secret, other string
	}{"/paid": {"payment.paid", paidEP.Secret, refundEP.Secret}, "/refunds": {"payment.refunded", refundEP.Secret, paidEP.Secret}} {
		require.Len(t, got[path], 1, path)
		r := got[path][0]
		require.Equal(t, c.typ, r.typ, path)
		require.Equal(t, c.typ, want[r.id], "%s: webhook-id is the %s event's message id", path, c.typ)
		require.True(t, verify(c.secret, r.header, r.body), "%s: signed with its own secret", path)
		require.False(t, verify(c.other, r.header, r.body), "%s: not with the other endpoint's", path)
	}
}
