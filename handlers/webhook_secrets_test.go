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

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
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

// With a key, the secret is stored sealed, not as itself, and the sender
// opens it to sign: the merchant verifies with the secret it was shown.
// A sender with another key cannot sign, and says why.
func TestSealedSecretSignsAndWrongKeyFails(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	site := &signatureSite{}
	srv := httptest.NewServer(site)
	t.Cleanup(srv.Close)
	key := sealKey(t, 1)
	m, err := sealingService(t, p, key, 0).CreateMerchant(context.Background(), app.NewMerchant{Name: "Sealed", WebhookURL: srv.URL})
	require.NoError(t, err)

	var stored string
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT webhook_secret FROM merchants WHERE id = $1`, m.ID).Scan(&stored))
	require.NotEqual(t, m.WebhookSecret, stored)
	require.NotContains(t, stored, strings.TrimPrefix(m.WebhookSecret, "whsec_"), "the ciphertext is not the secret")
	require.True(t, secretseal.Sealed(stored))

	record(t, p, m, 1)
	stop := runStoppable(t, handlers.NewSender(p.schema.Pool, fastRetries(handlers.NotifyConfig{AllowPrivate: true, SecretKey: key})).Run)
	h, body := site.last(t, 1)
	require.True(t, verify(m.WebhookSecret, h, body))
	stop()

	wrong := record(t, p, m, 1)[0]
	run(t, handlers.NewSender(p.schema.Pool, fastRetries(handlers.NotifyConfig{AllowPrivate: true, SecretKey: sealKey(t, 2)})).Run)
	a := settledDelivery(t, p, wrong)
	require.Contains(t, a.lastErr, "cannot sign")
	require.Contains(t, a.lastErr, "OUTFLOW_SECRET_KEY")
	require.Len(t, a.errors, 2, "retried: the operator may fix the key")
	require.NotContains(t, a.lastErr, strings.TrimPrefix(m.WebhookSecret, "whsec_"))
}

// After a rotation, webhooks carry two signatures, one per secret, until
// the grace period ends; then only the new secret's.
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

	run(t, handlers.NewSender(p.schema.Pool, fastRetries(handlers.NotifyConfig{AllowPrivate: true, SecretKey: key})).Run)
	record(t, p, m, 1)
	h, body := site.last(t, 1)
	require.Len(t, strings.Fields(h.Get("webhook-signature")), 2)
	require.True(t, verify(rot.WebhookSecret, h, body), "verifies with the new secret")
	require.True(t, verify(m.WebhookSecret, h, body), "and with the old one, during the grace period")

	// The grace period ends (moved, rather than waited for).
	_, err = p.schema.Pool.Exec(context.Background(),
		`UPDATE merchants SET previous_webhook_secret_expires_at = now() - interval '1 second' WHERE id = $1`, m.ID)
	require.NoError(t, err)
	record(t, p, m, 1)
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
