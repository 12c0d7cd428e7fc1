package handlers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// lossRedis is a redis-server of the test's own, which it may flush or
// restart empty, and a proxy in front of it for the workers, which the test
// cuts to keep them from reading while the forwarder publishes.
type lossRedis struct {
	srv    *outflowtest.RedisServer
	client *redis.Client
	proxy  *outflowtest.Proxy
}

func startLossRedis(t *testing.T) *lossRedis {
	t.Helper()
	srv := outflowtest.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return &lossRedis{srv: srv, client: c, proxy: outflowtest.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", srv.Port))}
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
		lose    func(*lossRedis, *testing.T)
	}{
		{"flush, consumers absent", false, (*lossRedis).flush},
		{"flush, consumers present", true, (*lossRedis).flush},
		{"restart without persistence, consumers present", true, (*lossRedis).restartEmpty},
	} {
		for _, audit := range []bool{true, false} {
			name := tc.name + ", audit on"
			if !audit {
				name = tc.name + ", audit off"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				redisLoss(t, tc.present, audit, tc.lose)
			})
		}
	}
}

func redisLoss(t *testing.T, present, audit bool, lose func(*lossRedis, *testing.T)) {
	ctx := context.Background()
	r := startLossRedis(t)
	p := newPipeline(t)
	// The workers read through the proxy; the forwarder writes directly.
	p.backend = openBackend(t, brokers.Config{Kind: brokers.Redis, Partitions: 2,
		Redis: brokers.RedisConfig{URL: "redis://" + r.proxy.Addr + "/0"}})
	direct := openBackend(t, brokers.Config{Kind: brokers.Redis, Partitions: 2, Redis: brokers.RedisConfig{URL: r.srv.URL}})
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)

	interval := 100 * time.Millisecond
	if !audit {
		interval = -1
	}
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: direct.Broker(), PollInterval: 50 * time.Millisecond,
		BatchSize: 20, AuditInterval: interval, Registerer: reg, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)

	want := app.CurrencyStats{Currency: "EUR"}
	add := func(s app.CurrencyStats) {
		want.PaidCount += s.PaidCount
		want.PaidAmount = want.PaidAmount.Plus(s.PaidAmount)
		want.RefundedAmount = want.RefundedAmount.Plus(s.RefundedAmount)
	}
	if present {
		// The consumers are subscribed, each group at its position, and
		// have applied the first events when the workers are cut off.
		run(t, p.worker(t, time.Second, counter).Run)
		add(p.drive(t, m.ID, 10))
		outflowtest.WaitFor(t, 30*time.Second, "the first events applied by every consumer", func() bool {
			return p.stats(t, m.ID) == want && len(counted()) == p.events(t)
		})
		r.proxy.Stop()
	}
	add(p.drive(t, m.ID, 20))
	outflowtest.WaitFor(t, 30*time.Second, "every event published", func() bool {
		var pending int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&pending))
		return pending == 0
	})
	if audit {
		outflowtest.WaitFor(t, 10*time.Second, "the audit's baseline of both streams", func() bool {
			var n int
			require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_audit WHERE state IS NOT NULL`).Scan(&n))
			return n == 2
		})
	}

	lose(r, t)
	if present {
		r.proxy.Start()
	} else {
		run(t, p.worker(t, time.Second, counter).Run)
	}

	if !audit {
		// Everything goes on, a new event included, and the lost events
		// stay lost.
		pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: 1, Currency: "EUR"})
		require.NoError(t, err)
		var sentinel string
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT message_id::text FROM outbox WHERE aggregate_id = $1`, pay.ID).Scan(&sentinel))
		outflowtest.WaitFor(t, 60*time.Second, "an event published after the loss applied", func() bool { return counted()[sentinel] > 0 })
		require.Less(t, len(counted()), p.events(t), "without the audit, events lost by Redis never reach the consumers")
		require.NotEqual(t, want, p.stats(t, m.ID), "without the audit, the projection misses the lost events")
		return
	}

	outflowtest.WaitFor(t, 60*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, want, p.stats(t, m.ID), "the projection still matches the payments")
	require.GreaterOrEqual(t, metricSum(t, reg, "outflow_forwarder_broker_losses_total"), 1.0)
	require.GreaterOrEqual(t, metricSum(t, reg, "outflow_forwarder_repaired_total"), 20.0, "at least the events lost are published again")
}
