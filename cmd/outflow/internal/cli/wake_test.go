package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// With the api and the forwarder in one process, each command wakes the
// forwarder after its commit: with polls an hour apart, the events still
// reach the stream at once.
func TestServeWakesItsForwarderAfterEachCommand(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redisSrv := testservers.StartRedis(t) // streams are named after topics ("payments")
	addr := freeAddr(t)
	cmd := command(map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL, "HTTP_ADDR": addr},
		"serve", "--roles", "api,forwarder", "--poll-interval", "1h", "--min-poll-interval", "1h")
	var stderr outflowtest.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	ctx := context.Background()
	outflowtest.WaitFor(t, 20*time.Second, "every partition leased", func() bool {
		var n int
		err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions WHERE owner IS NOT NULL`).Scan(&n)
		return err == nil && n == 16
	})

	base := "http://" + addr
	outflowtest.WaitFor(t, 20*time.Second, "the api ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	key := createKey(t, s.URL, "--admin")
	post := func(path string, body any) map[string]any {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(authedRequest(t, http.MethodPost, base+path, key, b))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Less(t, resp.StatusCode, 300, "POST %s: %s", path, stderr.String())
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out
	}
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", redisSrv.Port)})
	defer rdb.Close()
	m := post("/v1/merchants", map[string]any{"name": "Wake", "webhook_url": "https://wake.example/h"})
	// The first event may ride on the claim that follows the leases; the
	// later ones can only come from the commands' wake.
	for i := 1; i <= 3; i++ {
		post("/v1/payments", map[string]any{"merchant_id": m["id"], "amount": 100 * i, "currency": "EUR"})
		outflowtest.WaitFor(t, 10*time.Second, "the payment's event on the stream", func() bool {
			n, err := rdb.XLen(ctx, app.PaymentsTopic).Result()
			return err == nil && n == int64(i)
		})
	}
}
