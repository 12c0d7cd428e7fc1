package handlers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// lossRedis is a redis-server of the test's own, which it may flush or
// restart empty, and a proxy in front of it for the workers, which the test
// cuts to keep them from reading while the forwarder publishes.
type lossRedis struct {
	srv    *testservers.RedisServer
	client *redis.Client
	proxy  *testservers.Proxy
}

func startLossRedis(t *testing.T) *lossRedis {
	t.Helper()
	srv := testservers.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return &lossRedis{srv: srv, client: c, proxy: testservers.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", srv.Port))}
}

func (r *lossRedis) flush(t *testing.T) {
	t.Helper()
	require.NoError(t, r.client.FlushAll(context.Background()).Err())
}

// restartEmpty restarts the server without its data, as a Redis without
// persistence (or whose append-only file was lost) comes back.
func (r *lossRedis) restartEmpty(t *testing.T) {
	t.Helper()
	dir, err := r.client.ConfigGet(context.Background(), "dir").Result()
	require.NoError(t, err)
	r.srv.Stop()
	require.NoError(t, os.RemoveAll(filepath.Join(dir["dir"], "appendonlydir")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir["dir"], "dump.rdb")))
	r.srv.Start()
}

// Redis loses what it acknowledged between the forwarder's publish and the
// consumers' reads: flushed with the consumers absent (their workers start
// after the loss), flushed with them present (running, cut off from Redis
// while the forwarder publishes, back after the loss), restarted without
// persistence with them present. With the audit on, every check of the
// end-to-end suite holds: the projection exact, each event's effect once,
// one webhook per paid or refunded event. With the audit off, the same
// failure loses events for good: the test proves something.
func TestRedisLossRepaired(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		present bool
		reboot  bool
		lose    func(*lossRedis, *testing.T)
	}{
		{"flush, consumers absent", false, false, (*lossRedis).flush},
		{"flush before any audit, forwarder restarted, consumers present", true, true, (*lossRedis).flush},
		{"restart without persistence, consumers present", true, false, (*lossRedis).restartEmpty},
	} {
		for _, audit := range []bool{true, false} {
			name := tc.name + ", audit on"
			if !audit {
				name = tc.name + ", audit off"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				redisLoss(t, tc.present, tc.reboot, audit, tc.lose)
			})
		}
	}
}

func redisLoss(t *testing.T, present, reboot, audit bool, lose func(*lossRedis, *testing.T)) {
	r := startLossRedis(t)
	p := newPipeline(t)
	// The workers read through the proxy; the forwarder writes directly.
	p.backend = openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
		Redis: brokers.RedisConfig{URL: "redis://" + r.proxy.Addr + "/0"}})
	direct := openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2, Redis: brokers.RedisConfig{URL: r.srv.URL}})
	brokerLoss{direct: direct, cut: r.proxy.Stop, uncut: r.proxy.Start, lose: func(t *testing.T) { lose(r, t) }, reboot: reboot}.run(t, p, present, audit)
}
