package handlers_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

func sealKey(t *testing.T, b byte) *secretseal.Key {
	t.Helper()
	k, err := secretseal.ParseKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)))
	require.NoError(t, err)
	return k
}

// sealingService is a service with OUTFLOW_SECRET_KEY set.
func sealingService(t *testing.T, p *pipeline, key *secretseal.Key, grace time.Duration) *app.Service {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: p.schema.Pool, Events: w, AllowPrivateWebhooks: true, SecretKey: key,
		WebhookSecretGrace: grace})
	require.NoError(t, err)
	return svc
}

// signatureSite records every delivery's headers and body.
type signatureSite struct {
	mu       sync.Mutex
	received []struct {
		h    http.Header
		body []byte
	}
}

func (s *signatureSite) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.received = append(s.received, struct {
		h    http.Header
		body []byte
	}{r.Header.Clone(), body})
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *signatureSite) last(t *testing.T, n int) (http.Header, []byte) {
	t.Helper()
	outflowtest.WaitFor(t, 10*time.Second, "the webhook received", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.received) >= n
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.received[n-1]
	return r.h, r.body
}

// recordMessage records a payment.paid message for the merchant's
// endpoints, as NotifyMerchant's handler does, and returns its id.
func recordMessage(t *testing.T, p *pipeline, merchantID string) string {
	t.Helper()
	id := uuid.NewString()
	r, err := fanout.Enqueue(context.Background(), p.schema.Pool, webhooks.Message{ID: id, AccountID: merchantID,
		EventType: "payment.paid", OccurredAt: time.Now(), SchemaVersion: 1, Payload: []byte(`{}`)}, fanout.Target{}, "")
	require.NoError(t, err)
	require.Equal(t, 1, r.Pending, "the merchant's endpoint (00034's trigger) takes it")
	return id
}

// With a key, the secret is stored sealed, not as itself, and the sender
// opens it (the merchant's endpoint has the merchant's id, the associated
// data it was sealed with) to sign: the merchant verifies with the secret
// it was shown. A sender with another key cannot sign, says why, and
// retries (the operator may fix the key).
func TestSealedSecretSignsAndWrongKeyFails(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	site := &signatureSite{}
	srv := httptest.NewServer(site)
	t.Cleanup(srv.Close)
	key := sealKey(t, 1)
	m, err := sealingService(t, p, key, 0).CreateMerchant(context.Background(), app.NewMerchant{Name: "Sealed", WebhookURL: srv.URL})
	require.NoError(t, err)

	var stored, endpointSecret string
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT m.webhook_secret, e.secret
		FROM merchants m JOIN webhook_endpoints e ON e.id = m.id WHERE m.id = $1`, m.ID).Scan(&stored, &endpointSecret))
	require.NotEqual(t, m.WebhookSecret, stored)
	require.NotContains(t, stored, strings.TrimPrefix(m.WebhookSecret, "whsec_"), "the ciphertext is not the secret")
	require.True(t, secretseal.Sealed(stored))
	require.Equal(t, stored, endpointSecret, "the endpoint holds the merchant's sealed secret")

	recordMessage(t, p, m.ID)
	stop := runStoppable(t, newWebhookSender(p, fastSchedule(sender.Config{SecretKey: key})).Run)
	h, body := site.last(t, 1)
	require.True(t, verify(m.WebhookSecret, h, body))
	stop()

	wrong := recordMessage(t, p, m.ID)
	run(t, newWebhookSender(p, fastSchedule(sender.Config{SecretKey: sealKey(t, 2)})).Run)
	var lastErr string
	outflowtest.WaitFor(t, 10*time.Second, "two attempts that could not sign", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_endpoint_attempts a JOIN webhook_endpoint_deliveries d ON d.id = a.delivery_id
			WHERE d.message_id = $1`, wrong) >= 2
	})
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
		`SELECT last_error FROM webhook_endpoint_deliveries WHERE message_id = $1`, wrong).Scan(&lastErr))
	require.Contains(t, lastErr, "cannot sign")
	require.Contains(t, lastErr, "OUTFLOW_SECRET_KEY")
	require.NotContains(t, lastErr, strings.TrimPrefix(m.WebhookSecret, "whsec_"))
	site.mu.Lock()
	require.Len(t, site.received, 1, "nothing sent unsigned")
	site.mu.Unlock()
}

// A rotation through POST /v1/merchants/{id}/webhook_secret/rotate (the
// service's RotateWebhookSecret) reaches the merchant's endpoint (00034's
// trigger): webhooks carry two signatures, one per secret, until the grace
// period ends; then only the new secret's.
func TestRotationSignsWithBothDuringGrace(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	site := &signatureSite{}
	srv := httptest.NewServer(site)
	t.Cleanup(srv.Close)
	key := sealKey(t, 3)
	svc := sealingService(t, p, key, time.Hour)
	m, err := svc.CreateMerchant(context.Background(), app.NewMerchant{Name: "Rotating", WebhookURL: srv.URL})
	require.NoError(t, err)
	rot, err := svc.RotateWebhookSecret(context.Background(), m.ID)
	require.NoError(t, err)
	require.NotEqual(t, m.WebhookSecret, rot.WebhookSecret)
	require.NotNil(t, rot.PreviousSecretExpiresAt)
	var prevStored string
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
		`SELECT previous_webhook_secret FROM merchants WHERE id = $1`, m.ID).Scan(&prevStored))
	require.True(t, secretseal.Sealed(prevStored), "the previous secret stays sealed")

	run(t, newWebhookSender(p, fastSchedule(sender.Config{SecretKey: key})).Run)
	recordMessage(t, p, m.ID)
	h, body := site.last(t, 1)
	require.Len(t, strings.Fields(h.Get("webhook-signature")), 2)
	require.True(t, verify(rot.WebhookSecret, h, body), "verifies with the new secret")
	require.True(t, verify(m.WebhookSecret, h, body), "and with the old one, during the grace period")

	// The grace period ends (moved, rather than waited for), on the
	// merchant's row as an earlier release's rotation would write it.
	_, err = p.schema.Pool.Exec(context.Background(),
		`UPDATE merchants SET previous_webhook_secret_expires_at = now() - interval '1 second' WHERE id = $1`, m.ID)
	require.NoError(t, err)
	recordMessage(t, p, m.ID)
	h, body = site.last(t, 2)
	require.Len(t, strings.Fields(h.Get("webhook-signature")), 1)
	require.True(t, verify(rot.WebhookSecret, h, body))
	require.False(t, verify(m.WebhookSecret, h, body), "the old secret no longer verifies")
}

// Secrets stored in plaintext before the key was set keep working, and
// SealWebhookSecrets (`outflow webhook-secrets seal`) seals them in place.
func TestSealExistingPlaintextSecrets(t *testing.T) {
	t.Parallel()
	p := newPipeline(t) // no key: plaintext
	ctx := context.Background()
	var ms []app.CreatedMerchant
	for _, name := range []string{"A", "B", "C"} {
		ms = append(ms, merchant(t, p, name, "https://shop.example/"+name))
	}
	_, err := p.svc.RotateWebhookSecret(ctx, ms[0].ID) // a plaintext previous secret too
	require.NoError(t, err)
	key := sealKey(t, 4)
	n, err := app.SealWebhookSecrets(ctx, p.schema.Pool, key, 2)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Zero(t, count(t, p, `SELECT count(*) FROM merchants WHERE webhook_secret NOT LIKE 'enc:v1:%'
		OR previous_webhook_secret NOT LIKE 'enc:v1:%'`))
	for _, m := range ms[1:] {
		var stored string
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT webhook_secret FROM merchants WHERE id = $1`, m.ID).Scan(&stored))
		got, err := secretseal.Open(key, stored, m.ID)
		require.NoError(t, err)
		require.Equal(t, m.WebhookSecret, got)
	}
	n, err = app.SealWebhookSecrets(ctx, p.schema.Pool, key, 2)
	require.NoError(t, err)
	require.Zero(t, n, "idempotent")
	_, err = app.SealWebhookSecrets(ctx, p.schema.Pool, nil, 2)
	require.ErrorIs(t, err, secretseal.ErrNoKey)
}
