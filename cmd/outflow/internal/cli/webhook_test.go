package cli_test

import (
	"context"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
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
	var stderr syncBuffer
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
	var stderr syncBuffer
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
