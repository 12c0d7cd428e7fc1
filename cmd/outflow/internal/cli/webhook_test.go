package cli_test

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
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
// after --processed-retention, with the rest of the consumers' bookkeeping,
// and keeps pending and recent ones.
func TestWorkerPurgesSettledWebhooks(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redis := testservers.StartRedis(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		WITH d AS (
		    INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, status, created_at, next_attempt_at)
		    SELECT gen_random_uuid(), gen_random_uuid(), 'https://shop.example/' || s, 'payment.paid', '{}', s, now() - age,
		           now() + interval '1 hour'
		    FROM (VALUES ('delivered', interval '20 days'), ('dead', interval '20 days'), ('pending', interval '20 days'),
		                 ('delivered', interval '1 day')) v(s, age)
		    RETURNING id
		)
		INSERT INTO webhook_attempts (delivery_id, latency_ms) SELECT id, 1 FROM d`)
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
		return count(`SELECT count(*) FROM webhook_deliveries`) == 2
	})
	require.Equal(t, 2, count(`SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' OR created_at > now() - interval '2 days'`))
	require.Equal(t, 2, count(`SELECT count(*) FROM webhook_attempts`))

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit code 0 after SIGTERM: %s", stderr.String())
}
