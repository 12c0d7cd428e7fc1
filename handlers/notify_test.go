package handlers_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
)

// The example of the Standard Webhooks specification (and of the svix
// libraries that implement it).
func TestSignMatchesTheStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	sig, err := handlers.Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`))
	require.NoError(t, err)
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", sig)
}

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

func TestRetryableStatuses(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]bool{0: true, 200: false, 301: true, 302: true, 307: true, 400: false, 401: false, 404: false,
		408: true, 410: false, 422: false, 425: true, 429: true, 500: true, 502: true, 503: true} {
		require.Equal(t, want, handlers.Retryable(code), "status %d", code)
	}
}

// Deliveries go out signed, are retried on 5xx, 429 and timeouts, and die
// at once on other 4xx; every attempt is recorded.
func TestSenderRetriesAndDeadLetters(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	var calls atomic.Int32
	var secret atomic.Value
	var badSignature atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if s, ok := secret.Load().(string); ok && strings.HasSuffix(r.URL.Path, "/flaky") && !verify(s, r.Header, body) {
			badSignature.Store(true)
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/flaky"):
			switch calls.Add(1) {
			case 1:
				w.WriteHeader(http.StatusInternalServerError)
			case 2:
				w.WriteHeader(http.StatusTooManyRequests)
			case 3:
				time.Sleep(1500 * time.Millisecond) // past the sender's timeout
			default:
				w.WriteHeader(http.StatusNoContent)
			}
		case strings.HasSuffix(r.URL.Path, "/gone"):
			w.WriteHeader(http.StatusGone)
		}
	}))
	t.Cleanup(srv.Close)

	flaky, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Flaky", WebhookURL: srv.URL + "/flaky"})
	require.NoError(t, err)
	secret.Store(flaky.WebhookSecret)
	gone, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Gone", WebhookURL: srv.URL + "/gone"})
	require.NoError(t, err)
	for _, m := range []app.CreatedMerchant{flaky, gone} {
		_, err := p.schema.Pool.Exec(ctx, `INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body)
			VALUES (gen_random_uuid(), $1, $2, 'payment.paid', '{"type":"payment.paid"}')`, m.ID, m.WebhookURL)
		require.NoError(t, err)
	}

	sender := newSender(t, p, handlers.NotifyConfig{Timeout: time.Second, Backoff: 10 * time.Millisecond, // a timeout a loaded machine's answers stay under
		BackoffMax: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	run(t, sender.Run)

	status := func(url string) (string, int) {
		var s string
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `
			SELECT d.status, (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id)
			FROM webhook_deliveries d WHERE url = $1`, url).Scan(&s, &n))
		return s, n
	}
	outflowtest.WaitFor(t, 10*time.Second, "the flaky merchant served", func() bool { s, _ := status(flaky.WebhookURL); return s == "delivered" })
	_, attempts := status(flaky.WebhookURL)
	require.Equal(t, 4, attempts, "500, 429 and a timeout were retried")
	outflowtest.WaitFor(t, 10*time.Second, "the gone merchant given up", func() bool { s, _ := status(gone.WebhookURL); return s == "dead" })
	_, attempts = status(gone.WebhookURL)
	require.Equal(t, 1, attempts, "a 410 is not retried")
	require.False(t, badSignature.Load(), "every delivery verifies with the merchant's secret")
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
	require.NoError(t, w.Add(handlers.NotifyMerchant(pool, cfg)))
	return w
}

func paid(t *testing.T, p *pipeline, merchantID string) {
	t.Helper()
	ctx := context.Background()
	pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: merchantID, Amount: 100, Currency: "EUR"})
	require.NoError(t, err)
	_, err = p.svc.Pay(ctx, pay.ID)
	require.NoError(t, err)
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
	require.NoError(t, consumerDB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries`).Scan(&n))
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
	sender := newSender(t, p, handlers.NotifyConfig{PollInterval: time.Hour})
	run(t, sender.Run) // its first round, at start, finds nothing
	p.runForwarder(t, 0)
	run(t, consumerWorker(t, p, p.schema.Pool, handlers.NotifyConfig{Wake: sender.Wake}).Run)
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
