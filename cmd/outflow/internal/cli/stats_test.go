package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/sql"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// stats --json counts the consumers' lag (from the broker), held and dead
// messages and the webhooks' backlog (from the database); every listing
// command prints JSON that parses.
func TestStatsAndListsAsJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redisSrv := testservers.StartRedis(t) // streams are named after topics ("payments")
	env := map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL}

	// Two events on the stream no worker ever read: sync-analytics and
	// notify-merchant lag by both.
	opts, err := redis.ParseURL(redisSrv.URL)
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	for range 2 {
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: "payments", ID: "1000-*", Values: map[string]any{"k": "v"}}).Err())
	}
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
		                          payload, metadata, status, reason)
		VALUES ('notify-merchant', gen_random_uuid(), 'payment.created', 'payment', 'p1', 1, '', '{}', 'dead', 'handler failed'),
		       ('notify-merchant', gen_random_uuid(), 'payment.captured', 'payment', 'p1', 2, '', '{}', 'held', 'held'),
		       ('notify-merchant', gen_random_uuid(), 'payment.captured', 'payment', 'p1', 3, '', '{}', 'held', 'held'),
		       ('notify-merchant', gen_random_uuid(), 'payment.created', 'payment', 'p2', 1, '', '{}', 'resolved', 'gap');
		INSERT INTO webhook_endpoints (id, account_id, url, secret)
		VALUES ('0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60', 'acct', 'https://m.example', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
		WITH m AS (
		    INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, payload)
		    SELECT gen_random_uuid(), 'acct', 'payment.paid', now(), '{}' FROM generate_series(1, 4)
		    RETURNING id
		), n AS (SELECT id, row_number() OVER () i FROM m)
		INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, attempts, next_attempt_at)
		SELECT n.id, '0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60', v.status, v.attempts, now() + interval '1 hour'
		FROM n JOIN (VALUES (1, 'pending', 0), (2, 'pending', 3), (3, 'failed', 10), (4, 'delivered', 1)) v(i, status, attempts)
		  ON v.i = n.i;
		-- An earlier release's: its pending one counts until the handover
		-- moves it; its dead ones were that release's.
		INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, status, attempts)
		VALUES (gen_random_uuid(), gen_random_uuid(), 'https://m.example', 'payment.paid', '', 'pending', 2),
		       (gen_random_uuid(), gen_random_uuid(), 'https://m.example', 'payment.paid', '', 'dead', 8),
		       (gen_random_uuid(), gen_random_uuid(), 'https://m.example', 'payment.paid', '', 'moved', 1)`)
	require.NoError(t, err)

	out, err := command(env, "stats", "--json").Output()
	require.NoError(t, err, "%s", out)
	var got struct {
		Outbox    map[string]float64 `json:"outbox"`
		Consumers map[string]struct {
			Topic                     string   `json:"topic"`
			Lag                       *int64   `json:"lag"`
			OldestUnhandledAgeSeconds *float64 `json:"oldest_unhandled_age_seconds"`
			Held, Retrying, Dead      int64
		} `json:"consumers"`
		Webhooks map[string]int64 `json:"webhooks"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Contains(t, got.Outbox, "pending")
	require.Equal(t, map[string]int64{"pending": 3, "failing": 2, "dead": 1}, got.Webhooks)
	require.Len(t, got.Consumers, 2, "%s", out)
	for _, name := range []string{"sync-analytics", "notify-merchant"} {
		c := got.Consumers[name]
		require.Equal(t, "payments", c.Topic, name)
		require.NotNil(t, c.Lag, name)
		require.EqualValues(t, 2, *c.Lag, name)
		require.Greater(t, *c.OldestUnhandledAgeSeconds, 1e6, "%s: the entries' ids are from 1970", name)
	}
	nm := got.Consumers["notify-merchant"]
	require.Equal(t, [3]int64{2, 0, 1}, [3]int64{nm.Held, nm.Retrying, nm.Dead})

	var dls []map[string]any
	out, err = command(env, "dlq", "list", "--json").Output()
	require.NoError(t, err, "%s", out)
	require.NoError(t, json.Unmarshal(out, &dls), "%s", out)
	require.Len(t, dls, 3, "the open ones")
	for _, args := range [][]string{{"outbox", "parked", "--json"}, {"apikey", "list", "--json"}} {
		out, err = command(env, args...).Output()
		require.NoError(t, err, "%v: %s", args, out)
		require.JSONEq(t, `[]`, string(out), "%v", args)
	}
	var migs []struct {
		Set     string `json:"set"`
		Applied bool   `json:"applied"`
	}
	out, err = command(env, "migrate", "status", "--json").Output()
	require.NoError(t, err, "%s", out)
	require.NoError(t, json.Unmarshal(out, &migs), "%s", out)
	require.NotEmpty(t, migs)
	for _, m := range migs {
		require.True(t, m.Applied, "%+v", m)
	}
}

// `serve --roles worker` exports the consumers' metrics on its metrics
// address.
func TestWorkerRoleExportsConsumerMetrics(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redisSrv := testservers.StartRedis(t)
	metrics := freeAddr(t)
	cmd := command(map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL},
		"serve", "--roles", "worker", "--metrics-addr", metrics)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	want := []string{
		`outflow_consumer_handled_total{consumer="notify-merchant",topic="payments"} 0`,
		`outflow_consumer_dead_total{consumer="sync-analytics",topic="payments"} 0`,
		`outflow_consumer_lag_events{consumer="sync-analytics",topic="payments"} 0`,
		`outflow_consumer_oldest_unhandled_age_seconds{consumer="notify-merchant",topic="payments"} 0`,
	}
	outflowtest.WaitFor(t, 20*time.Second, "the consumer metrics on /metrics", func() bool {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(b)
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})
}

// stats asks any backend for lag, not only redis: here the sql broker's
// tables, in the test's schema. Asking creates no offsets row (nor, on a
// topic nobody published to, any table).
func TestStatsLagOnTheSQLBroker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	env := map[string]string{"DATABASE_URL": s.URL, "OUTFLOW_BROKER": "sql", "REDIS_URL": "redis://127.0.0.1:1"}

	b, err := brokers.Open(ctx, brokers.Config{Kind: brokers.SQL, SQL: brokers.SQLConfig{DatabaseURL: s.URL}})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	var msgs []forwarder.Outgoing
	for i := range 2 {
		msgs = append(msgs, forwarder.Outgoing{Topic: "payments", AggregateID: fmt.Sprint("p", i),
			Message: message.NewMessage(watermill.NewUUID(), []byte(`{}`))})
	}
	require.NoError(t, errors.Join(b.Broker().Publish(ctx, msgs)...))

	out, err := command(env, "stats", "--json").Output()
	require.NoError(t, err, "%s", out)
	var got struct {
		Consumers map[string]struct {
			Lag                       *int64   `json:"lag"`
			OldestUnhandledAgeSeconds *float64 `json:"oldest_unhandled_age_seconds"`
		} `json:"consumers"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Len(t, got.Consumers, 2, "%s", out)
	for name, c := range got.Consumers {
		require.NotNil(t, c.Lag, "%s: %s", name, out)
		require.EqualValues(t, 2, *c.Lag, name)
		require.Positive(t, *c.OldestUnhandledAgeSeconds, name)
	}
	var groups int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM watermill_offsets_payments`).Scan(&groups))
	require.Zero(t, groups, "stats created a group's position")
}
