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

func TestRetentionFlagsAreValidated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args string
		want string
	}{
		{"worker --processed-retention 0s", "invalid --processed-retention: must be at least 1h0m0s"},
		{"worker --processed-retention 30m", "invalid --processed-retention"},
		{"worker --processed-retention soon", `invalid argument "soon" for "--processed-retention"`},
		{"serve --roles worker --processed-retention 0s", "invalid --processed-retention"},
		{"serve --idempotency-key-ttl 0s", "invalid --idempotency-key-ttl: must be at least 1m0s"},
		{"serve --idempotency-key-ttl 10s", "invalid --idempotency-key-ttl"},
	}
	for _, tt := range tests {
		// Flags are checked before anything connects: no database needed.
		out, err := command(map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none"}, strings.Fields(tt.args)...).CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, tt.args)
		require.Contains(t, string(out), tt.want, tt.args)
	}
}

// `serve --roles api,worker` expires old Idempotency-Keys (api) and purges
// old consumer bookkeeping (worker), and keeps everything else.
func TestServeRunsRetentionForItsRoles(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redis := testservers.StartRedis(t) // the worker's consumer groups stay off the shared server
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO api_keys (id, prefix, key_hash) VALUES ('00000000-0000-0000-0000-0000000000a1', 'ofk_test', sha256('k'));
		INSERT INTO idempotency_keys (api_key_id, key, request_hash, status_code, response_body, created_at)
		SELECT '00000000-0000-0000-0000-0000000000a1', k, '\x00', 201, '{}', t
		FROM (VALUES ('old', now() - interval '25 hours'), ('new', now())) v(k, t);
		INSERT INTO processed_messages (message_id, consumer, processed_at) VALUES
		    (gen_random_uuid(), 'sync-analytics', now() - interval '16 days'), (gen_random_uuid(), 'sync-analytics', now() - interval '17 days');
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
		                          payload, metadata, status, reason, created_at, resolved_at)
		SELECT 'sync-analytics', gen_random_uuid(), 'payment.paid', 'payment', 'p-' || s, 1, '\x7b7d', '{}', s, 'test',
		       now() - interval '20 days', CASE WHEN s = 'resolved' THEN now() - interval '20 days' END
		FROM unnest(ARRAY['resolved', 'dead']) s`)
	require.NoError(t, err)

	cmd := command(map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redis.URL, "HTTP_ADDR": freeAddr(t)},
		"serve", "--roles", "api,worker")
	var stderr outflowtest.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	count := func(q string) int {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, q).Scan(&n))
		return n
	}
	outflowtest.WaitFor(t, 20*time.Second, "old rows purged", func() bool {
		return count(`SELECT count(*) FROM idempotency_keys`) == 1 &&
			count(`SELECT count(*) FROM processed_messages`) == 0 && // its newest row past the retention: truncated
			count(`SELECT count(*) FROM dead_letters`) == 1
	})
	require.Equal(t, 1, count(`SELECT count(*) FROM idempotency_keys WHERE key = 'new'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM dead_letters WHERE status = 'dead'`), "open dead letters are kept")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit code 0 after SIGTERM: %s", stderr.String())
}
