package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/outflowtest"
)

func newKeyExpiry(t *testing.T, e *env, batch int) *httpapi.KeyExpiry {
	t.Helper()
	k, err := httpapi.NewKeyExpiry(httpapi.KeyExpiryConfig{Pool: e.pool, BatchSize: batch, Interval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return k
}

func TestKeyExpiryDeletesOnlyKeysOlderThanTTL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	m := e.createMerchant()
	body := map[string]any{"merchant_id": m.ID, "amount": 500, "currency": "EUR"}
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	first := map[string]paymentJSON{}
	for _, k := range keys {
		r := e.post("/v1/payments", body, k)
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		first[k] = decode[paymentJSON](t, r)
	}
	// k1..k5 are 25 hours old, k6 and k7 just under the TTL.
	_, err := e.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - CASE
		WHEN key IN ('k6', 'k7') THEN interval '23 hours' ELSE interval '25 hours' END`)
	require.NoError(t, err)

	k := newKeyExpiry(t, e, 2) // three batches
	n, err := k.PurgeOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, 2, e.counts().IdempotencyKeys)
	n, err = k.PurgeOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a second run finds nothing")

	// A live key still replays; an expired one is a new request.
	r := e.post("/v1/payments", body, "k6")
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first["k6"].ID, decode[paymentJSON](t, r).ID)
	r = e.post("/v1/payments", body, "k1")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"))
	require.NotEqual(t, first["k1"].ID, decode[paymentJSON](t, r).ID)
}

func TestKeyExpiryRunsUntilCancelled(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	for _, k := range []string{"a", "b", "c"} {
		r := e.post("/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 500, "currency": "EUR"}, k)
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- newKeyExpiry(t, e, 1000).Run(ctx) }()
	_, err := e.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 days'`)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 5*time.Second, "expired keys deleted by Run", func() bool { return e.counts().IdempotencyKeys == 0 })
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestKeyExpiryConfigValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []struct {
		name string
		cfg  httpapi.KeyExpiryConfig
		want string // "" for valid
	}{
		{"defaults", httpapi.KeyExpiryConfig{Pool: e.pool}, ""},
		{"no pool", httpapi.KeyExpiryConfig{}, "Pool: is required"},
		{"ttl too short", httpapi.KeyExpiryConfig{Pool: e.pool, TTL: time.Second}, "TTL: must be at least 1m"},
		{"negative ttl", httpapi.KeyExpiryConfig{Pool: e.pool, TTL: -time.Hour}, "TTL: must be at least 1m"},
		{"negative batch", httpapi.KeyExpiryConfig{Pool: e.pool, BatchSize: -1}, "BatchSize"},
		{"negative interval", httpapi.KeyExpiryConfig{Pool: e.pool, Interval: -time.Second}, "Interval: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httpapi.NewKeyExpiry(tt.cfg)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// The same Idempotency-Key value from two API keys is two rows; expiring
// the old one leaves the other's alone.
func TestKeyExpiryDeletesPerAPIKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	m := e.createMerchant()
	mk := e.as(m.APIKey)
	body := map[string]any{"merchant_id": m.ID, "amount": 500, "currency": "EUR"}
	for _, c := range []*env{e, mk} {
		r := c.post("/v1/payments", body, "shared")
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	require.Equal(t, 2, e.counts().IdempotencyKeys)
	_, err := e.pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 days'
		WHERE api_key_id = (SELECT id FROM api_keys WHERE merchant_id IS NULL)`)
	require.NoError(t, err)
	n, err := newKeyExpiry(t, e, 10).PurgeOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, e.counts().IdempotencyKeys, "the merchant key's row is young: kept")
	r := mk.post("/v1/payments", body, "shared")
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
}
