package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

func TestWebhookFlagsAreValidated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args string
		want string
	}{
		{"worker --webhook-timeout 0s", "invalid --webhook-timeout"},
		{"worker --webhook-concurrency 0", "invalid --webhook-concurrency"},
		{"worker --webhook-concurrency 2 --webhook-per-merchant 3", "invalid --webhook-per-merchant"},
		{"serve --roles worker --webhook-per-merchant 0", "invalid --webhook-per-merchant"},
	}
	for _, tt := range tests {
		// Flags are checked before anything connects: no database needed.
		out, err := command(map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none"}, strings.Fields(tt.args)...).CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, tt.args)
		require.Contains(t, string(out), tt.want, tt.args)
	}
	// --webhook-per-merchant's default follows a lower --webhook-concurrency
	// down instead of failing a setting the user never gave: the command
	// gets past its flags, to the unreachable database.
	out, err := command(map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none"}, "worker", "--webhook-concurrency", "2").CombinedOutput()
	require.Error(t, err)
	require.NotContains(t, string(out), "invalid --webhook-per-merchant")
	require.Contains(t, string(out), "127.0.0.1:1")
}

// `outflow worker` purges settled webhook deliveries and their attempts
// after --processed-retention (deliveries.Purge), with the rest of the
// consumers' bookkeeping, and keeps pending and recent ones; a message
// goes with its last delivery.
func TestWorkerPurgesSettledWebhooks(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redis := testservers.StartRedis(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (id, account_id, url, secret)
		VALUES ('0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60', 'acct', 'https://shop.example/hooks', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
		WITH v(s, age) AS (VALUES ('delivered', interval '20 days'), ('failed', interval '20 days'),
		                          ('pending', interval '20 days'), ('delivered', interval '1 day')),
		m AS (
		    INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, payload, created_at)
		    SELECT gen_random_uuid(), 'acct', v.s, now() - v.age, '{}', now() - v.age FROM v
		    RETURNING id, event_type AS s, created_at
		), d AS (
		    INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, created_at, next_attempt_at, settled_at)
		    SELECT m.id, '0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60', m.s, m.created_at, now() + interval '1 hour',
		           CASE WHEN m.s <> 'pending' THEN m.created_at END
		    FROM m
		    RETURNING id, endpoint_id
		)
		INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, latency_ms) SELECT id, endpoint_id, 1 FROM d`)
	require.NoError(t, err)

	cmd := command(map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redis.URL}, "worker")
	var stderr outflowtest.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	count := func(q string) int {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, q).Scan(&n))
		return n
	}
	outflowtest.WaitFor(t, 20*time.Second, "old settled deliveries purged", func() bool {
		return count(`SELECT count(*) FROM webhook_endpoint_deliveries`) == 2
	})
	require.Equal(t, 2, count(`SELECT count(*) FROM webhook_endpoint_deliveries
		WHERE status = 'pending' OR created_at > now() - interval '2 days'`))
	require.Equal(t, 2, count(`SELECT count(*) FROM webhook_endpoint_attempts`))
	require.Equal(t, 2, count(`SELECT count(*) FROM webhook_messages`), "the purged deliveries' messages went with them")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit code 0 after SIGTERM: %s", stderr.String())
}

// `outflow worker` runs the handover beside its sender: a delivery an
// earlier release's NotifyMerchant left pending in webhook_deliveries is
// moved (marked 'moved') and sent by the webhook package's sender to the
// merchant's endpoint, with its webhook-id and signed with the merchant's
// secret, once.
func TestWorkerHandsOverLegacyDeliveries(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redis := testservers.StartRedis(t)
	ctx := context.Background()
	site := &receivedWebhooks{at: map[string][]time.Time{}}
	srv := httptest.NewServer(site)
	t.Cleanup(srv.Close)
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: s.Pool, Events: w, AllowPrivateWebhooks: true})
	require.NoError(t, err)
	m, err := svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: srv.URL + "/hooks"})
	require.NoError(t, err)
	site.secret = m.WebhookSecret
	var legacyID string
	require.NoError(t, s.Pool.QueryRow(ctx, `
		INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, attempts)
		VALUES (gen_random_uuid(), $1, $2, 'payment.paid',
		        '{"type":"payment.paid","timestamp":"2026-12-01T10:00:00Z","data":{"merchant_id":"x"}}', 1)
		RETURNING message_id::text`, m.ID, m.WebhookURL).Scan(&legacyID))

	cmd := command(map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redis.URL, "WEBHOOK_ALLOW_PRIVATE": "true"}, "worker")
	var stderr outflowtest.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	outflowtest.WaitFor(t, 30*time.Second, "the legacy delivery handed over and delivered", func() bool {
		var moved, delivered bool
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT
			EXISTS (SELECT 1 FROM webhook_deliveries WHERE message_id = $1 AND status = 'moved'),
			EXISTS (SELECT 1 FROM webhook_endpoint_deliveries WHERE message_id = $1 AND endpoint_id = $2 AND status = 'delivered')`,
			legacyID, m.ID).Scan(&moved, &delivered))
		return moved && delivered
	})
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit code 0 after SIGTERM: %s", stderr.String())
	site.mu.Lock()
	defer site.mu.Unlock()
	require.Len(t, site.at, 1)
	require.Len(t, site.at[legacyID], 1, "the legacy delivery's message id is its webhook-id, sent once")
	require.Zero(t, site.unsigned, "signed with the merchant's secret")
}

// hookReceipt is one webhook a test endpoint received.
type hookReceipt struct {
	typ    string
	header http.Header
	body   []byte
}

// End to end through `outflow serve --roles api,forwarder,worker`, secrets
// sealed: a merchant made through the API keeps its webhook_url (every
// event type, its secret), makes two endpoints through
// /v1/merchants/{id}/webhook_endpoints with different filters, and a
// payment paid then refunded reaches each endpoint with what it subscribed
// to and nothing else, signed with its own secret and not another's.
func TestServeDeliversToEachEndpointWhatItSubscribedTo(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redisSrv := testservers.StartRedis(t)
	var mu sync.Mutex
	got := map[string][]hookReceipt{} // path -> receipts
	hooks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b struct{ Type string }
		_ = json.Unmarshal(body, &b)
		mu.Lock()
		got[r.URL.Path] = append(got[r.URL.Path], hookReceipt{b.Type, r.Header.Clone(), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hooks.Close)
	api, stderr := startServe(t, map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL,
		"WEBHOOK_ALLOW_PRIVATE": "true", "OUTFLOW_SECRET_KEY": testSecretKey},
		"--roles", "api,forwarder,worker", "--metrics-addr", "")
	admin := createKey(t, s.URL, "--admin")
	post := func(key, path string, body any) map[string]any {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(authedRequest(t, http.MethodPost, "http://"+api+path, key, b))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Less(t, resp.StatusCode, 300, "POST %s: %v %s", path, out, stderr.String())
		return out
	}
	m := post(admin, "/v1/merchants", map[string]any{"name": "Shop", "webhook_url": hooks.URL + "/legacy"})
	id, merchantKey := m["id"].(string), m["api_key"].(string)
	secrets := map[string]string{"/legacy": m["webhook_secret"].(string)}
	for path, types := range map[string][]string{"/paid": {"payment.paid"}, "/refunds": {"payment.refunded"}} {
		ep := post(merchantKey, "/v1/merchants/"+id+"/webhook_endpoints", map[string]any{"url": hooks.URL + path, "event_types": types})
		secrets[path] = ep["secret"].(string)
	}
	pay := post(merchantKey, "/v1/payments", map[string]any{"merchant_id": id, "amount": 100, "currency": "EUR"})
	post(merchantKey, "/v1/payments/"+pay["id"].(string)+"/pay", nil)
	post(merchantKey, "/v1/payments/"+pay["id"].(string)+"/refund", nil)

	want := map[string][]string{"/legacy": {"payment.paid", "payment.refunded"}, "/paid": {"payment.paid"},
		"/refunds": {"payment.refunded"}}
	outflowtest.WaitFor(t, 60*time.Second, "every endpoint's webhooks", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for path, types := range want {
			if len(got[path]) < len(types) {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, len(want), "no other path")
	for path, types := range want {
		var gotTypes []string
		for _, r := range got[path] {
			gotTypes = append(gotTypes, r.typ)
			for other, secret := range secrets {
				verified := signing.Verify(secret, r.header, r.body, time.Now(), 0) == nil
				require.Equal(t, other == path, verified, "%s's %s webhook: verifies with %s's secret", path, r.typ, other)
			}
		}
		require.ElementsMatch(t, types, gotTypes, "%s gets what it subscribed to, once", path)
	}
	idOf := func(path, typ string) string {
		for _, r := range got[path] {
			if r.typ == typ {
				return r.header.Get("webhook-id")
			}
		}
		return ""
	}
	require.Equal(t, idOf("/paid", "payment.paid"), idOf("/legacy", "payment.paid"),
		"one message per event: every endpoint gets the same webhook-id")
	require.Equal(t, idOf("/refunds", "payment.refunded"), idOf("/legacy", "payment.refunded"))
}
