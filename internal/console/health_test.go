package console_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// hclock is a clock a test moves: the console's samples and its
// overview are then stamped exactly.
type hclock struct {
	t0     time.Time
	offset atomic.Int64
}

func newHClock() *hclock {
	return &hclock{t0: time.Now().UTC().Truncate(time.Minute)}
}

func (c *hclock) now() time.Time               { return c.t0.Add(time.Duration(c.offset.Load())) }
func (c *hclock) set(d time.Duration)          { c.offset.Store(int64(d)) }
func (c *hclock) at(d time.Duration) time.Time { return c.t0.Add(d) }

// healthEnv is a console on a fresh schema whose clock the test moves.
func healthEnv(t *testing.T, mut ...func(*console.Config)) (*env, *hclock, *http.Client) {
	t.Helper()
	clk := newHClock()
	e := newEnvWith(t, func(c *console.Console) { console.SetClock(c, clk.now) }, mut...)
	c := e.client(t)
	// Logged in (the login's overview read is the rate's first sample)
	// before the samples a test takes in the last hour.
	clk.set(-2 * time.Hour)
	e.login(t, c)
	clk.set(0)
	return e, clk, c
}

// sample takes a sample stamped at the clock's offset d.
func (e *env) sample(t *testing.T, clk *hclock, d time.Duration) {
	t.Helper()
	clk.set(d)
	require.NoError(t, e.console.Sample(context.Background()))
}

var tagRe = regexp.MustCompile(`<[^>]+>`)

// statusOf is the overview's status line as read: its state, and its
// reasons one per line.
func statusOf(t *testing.T, e *env, c *http.Client) (string, []string) {
	t.Helper()
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	m := regexp.MustCompile(`id="health-state">([^<]+)<`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	var why []string
	for _, li := range regexp.MustCompile(`<li class="why-[a-z]+">(.*?)</li>`).FindAllStringSubmatch(body, -1) {
		why = append(why, html.UnescapeString(tagRe.ReplaceAllString(li[1], "")))
	}
	return m[1], why
}

// The status line says what the shipped alerts' rules say, each reason
// with the alert's threshold and name, and how long the console's samples
// show it holding against the alert's for:. A page's condition is
// failing, a ticket's degraded; a panel not read is degraded.
func TestStatusLineFollowsTheRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		lag   brokers.LagReporter
		setup func(t *testing.T, e *env, clk *hclock)
		state string
		why   []string
	}{
		{name: "healthy", state: "healthy",
			setup: func(t *testing.T, e *env, clk *hclock) {
				e.insertOutbox(t, "pay-1", 1, true, false)
				e.sample(t, clk, -time.Minute)
			}},
		{name: "outbox stuck, held 2 min by the samples", state: "failing",
			setup: func(t *testing.T, e *env, clk *hclock) {
				e.exec(t, `INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at, created_at)
					VALUES (gen_random_uuid(), 'payments', 'payment', 'old', 1, 'payment.paid', '{}', now(), now() - interval '12 minutes 10 seconds')`)
				e.sample(t, clk, -2*time.Minute)
				e.sample(t, clk, -time.Minute)
			},
			why: []string{"failing: outbox oldest pending 12 min (> 5 min, OutflowOutboxStuck; for 2 min, the alert waits 5 min)"}},
		{name: "parked, now only", state: "degraded",
			setup: func(t *testing.T, e *env, clk *hclock) { e.insertOutbox(t, "pay-1", 1, false, true) },
			why:   []string{"degraded: 1 outbox row parked (> 0, OutflowOutboxParked; just now, the alert waits 5 min)"}},
		{name: "dead letters since the last samples", state: "degraded",
			setup: func(t *testing.T, e *env, clk *hclock) {
				e.sample(t, clk, -3*time.Minute)
				e.insertDead(t, "analytics", "00000000-0000-0000-0000-000000000001", "a", 1, "dead")
				e.insertDead(t, "analytics", "00000000-0000-0000-0000-000000000002", "b", 1, "dead")
				e.sample(t, clk, -time.Minute)
			},
			why: []string{"degraded: 2 new dead letters of analytics in the last 15 min (> 0, OutflowConsumerDeadLetters; from the console's samples of the last 3 min)"}},
		{name: "consumer lagging and backlogged", state: "failing",
			lag: staticLag{"analytics": {Events: 12000, OldestAge: 7 * time.Minute}},
			why: []string{
				"failing: analytics (payments) oldest unhandled event 7 min (> 5 min, OutflowConsumerLagging; just now, the alert waits 10 min)",
				"degraded: analytics (payments) lags 12,000 events (> 10,000, OutflowConsumerBacklog; just now, the alert waits 10 min)"}},
		{name: "webhook failure ratio", state: "degraded",
			setup: func(t *testing.T, e *env, clk *hclock) {
				d := e.insertDelivery(t, "delivered", 1, "")
				e.insertAttempts(t, d, 204) // before the console counted: not in its window
				e.sample(t, clk, -2*time.Minute)
				f := e.insertDelivery(t, "pending", 3, "HTTP 500")
				e.insertAttempts(t, f, 500, 0, 500)
				e.insertAttempts(t, d, 204)
				e.sample(t, clk, -time.Minute)
			},
			why: []string{"degraded: 75% of webhook attempts failed in the last 10 min (3 of 4) (> 20%, OutflowWebhookFailureRate; from the console's samples of the last 2 min; for 1 min, the alert waits 10 min)"}},
		{name: "webhook dead", state: "degraded",
			setup: func(t *testing.T, e *env, clk *hclock) {
				e.sample(t, clk, -5*time.Minute)
				e.insertDelivery(t, "dead", 9, "HTTP 410")
				e.sample(t, clk, -time.Minute)
			},
			why: []string{"degraded: 1 webhook delivery dead in the last 15 min (> 0, OutflowWebhookDead; from the console's samples of the last 5 min)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, clk, c := healthEnv(t, func(cfg *console.Config) {
				if tc.lag != nil {
					cfg.Lag = tc.lag
				}
			})
			if tc.setup != nil {
				tc.setup(t, e, clk)
			}
			clk.set(0)
			state, why := statusOf(t, e, c)
			require.Equal(t, tc.state, state)
			require.Equal(t, tc.why, why)
		})
	}

	// A panel that cannot be read: the rules cannot say all is well.
	t.Run("a table locked", func(t *testing.T) {
		t.Parallel()
		e, _, c := healthEnv(t, stalls)
		e.lockTable(t, "dead_letters")
		state, why := statusOf(t, e, c)
		require.Equal(t, "degraded", state)
		require.Equal(t, []string{"degraded: consumers not read: the database did not answer within 700ms, so its rules are not evaluated"}, why)
	})
}

// staticLag is a broker whose lags are fixed, for the status line's rules
// on lag: the lag's wording is tested against a real broker below.
type staticLag map[string]brokers.Lag

func (s staticLag) Lag(_ context.Context, group, _ string) (brokers.Lag, error) {
	if l, ok := s[group]; ok {
		return l, nil
	}
	return brokers.Lag{}, nil
}

// The lag reads as a count and an age, against a real Redis: entries
// written 3 minutes ago that no consumer group has read lag by their
// count and their age; a consumer with nothing to read lags "0"; a broker
// that cannot answer, "n/a".
func TestLagIsACountAndAnAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testservers.Redis(t)
	prefix := testservers.UniqueName(t, rc)
	b, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	lr, ok := b.(brokers.LagReporter)
	require.True(t, ok)
	// 1,234 entries of "payments", the oldest 3 min old by its id's time.
	stream := redisstreams.BrokerOf(b).Streams("payments")[0]
	old := time.Now().Add(-3*time.Minute - 20*time.Second).UnixMilli()
	pipe := rc.Pipeline()
	for i := range 1234 {
		pipe.XAdd(ctx, &goredis.XAddArgs{Stream: stream, ID: fmt.Sprintf("%d-%d", old, i+1), Values: []string{"k", "v"}})
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)

	e := newEnv(t, func(c *console.Config) {
		c.Lag = lr
		c.Consumers = []console.Consumer{{Name: "analytics", Topic: "payments"}, {Name: "idle", Topic: "refunds"}}
	})
	c := e.client(t)
	e.login(t, c)
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)
	require.Regexp(t, `data-consumer="analytics">.*\s*<td class="lag">1,234 events, oldest 3 min</td>`, body)
	require.Regexp(t, `data-consumer="idle">.*\s*<td class="lag zero">0</td>`, body)

	// A lag over a rule's threshold stands out.
	e2 := newEnv(t, func(c *console.Config) { c.Lag = staticLag{"analytics": {Events: 20000}} })
	c2 := e2.client(t)
	e2.login(t, c2)
	_, body = do(t, c2, http.MethodGet, e2.srv.URL+"/fragments/overview", nil)
	require.Regexp(t, `data-consumer="analytics">.*\s*<td class="lag warn">20,000 events</td>`, body)

	require.NoError(t, b.Close())
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)
	require.Regexp(t, `data-consumer="analytics">.*\s*<td class="lag">n/a</td>`, body)
}

var polylineRe = regexp.MustCompile(`<polyline class="series" data-series="([^"]+)"[^>]* points="([^"]*)"/>`)

// chartOf is a chart's SVG in body, and its polylines' points by series.
func chartOf(t *testing.T, body, id string) (string, map[string]string) {
	t.Helper()
	m := regexp.MustCompile(`(?s)<svg class="chart" id="` + id + `-svg".*?</svg>`).FindString(body)
	require.NotEmpty(t, m, "no chart %s", id)
	lines := map[string]string{}
	for _, p := range polylineRe.FindAllStringSubmatch(m, -1) {
		lines[p[1]] = p[2]
	}
	return m, lines
}

// The charts of the last hour are drawn from the console's samples: each
// point where its sample's time and value put it on the hour's axes, the
// rate between two samples at the second's, the scale labelled in its
// unit; with too few samples the chart says since when it collects.
func TestChartsOfTheLastHour(t *testing.T) {
	t.Parallel()
	e, clk, c := healthEnv(t, func(cfg *console.Config) { cfg.Lag = staticLag{"analytics": {Events: 40}} })
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)
	svg, lines := chartOf(t, body, "chart-rate")
	require.Contains(t, svg, "No sample yet")
	require.Empty(t, lines)
	require.Contains(t, body, "No sample yet: the console samples every 5 s while it runs.")

	e.exec(t, `INSERT INTO outbox_partitions (partition, published_total) VALUES (0, 0)`)
	e.sample(t, clk, -30*time.Minute)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)
	since := clk.at(-30 * time.Minute).Format("15:04:05")
	svg, _ = chartOf(t, body, "chart-rate")
	require.Contains(t, svg, "Too few samples yet: collecting since "+since+" UTC")

	// 600 events in the next 10 min (1/s), 1,200 in the 10 after (2/s).
	e.exec(t, `UPDATE outbox_partitions SET published_total = CASE partition WHEN 0 THEN 600 ELSE 0 END`)
	e.sample(t, clk, -20*time.Minute)
	e.exec(t, `UPDATE outbox_partitions SET published_total = CASE partition WHEN 0 THEN 1800 ELSE 0 END`)
	e.insertOutbox(t, "p", 1, false, true) // a parked row from now on
	e.sample(t, clk, -10*time.Minute)
	clk.set(0)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)

	// The hour spans x 52 to 410, the scale (0 to 2/s) y 150 to 12: the
	// sample at -20 min is at 40/60 of the hour, the one at -10 min 50/60.
	svg, lines = chartOf(t, body, "chart-rate")
	require.Equal(t, map[string]string{"published": "290.7,81.0 350.3,12.0"}, lines)
	require.Contains(t, svg, `<title id="chart-rate-title">Published rate</title>`)
	require.Contains(t, svg, `role="img"`)
	require.Regexp(t, `<desc id="chart-rate-desc">Published rate over the last hour, from \d\d:\d\d to \d\d:\d\d UTC: published now 2/s; scale up to 2/s</desc>`, svg)
	require.Contains(t, body, `<figcaption>Published rate <span class="muted">(events/s)</span></figcaption>`)
	for _, label := range []string{">0<", ">1<", ">2<", clk.at(-time.Hour).Format("15:04") + "<", clk.t0.Format("15:04") + " UTC<"} {
		require.Contains(t, svg, label)
	}
	require.Contains(t, body, "Collecting since "+since+" UTC.")

	// The lag per consumer: 40 events at every sample, on a scale of 50.
	_, lines = chartOf(t, body, "chart-lag")
	require.Equal(t, "231.0,39.6 290.7,39.6 350.3,39.6", lines["analytics"])
	// The failures: the parked row from the third sample on.
	_, lines = chartOf(t, body, "chart-failures")
	require.Equal(t, "231.0,150.0 290.7,150.0 350.3,12.0", lines["parked outbox rows"])
	require.Equal(t, "231.0,150.0 290.7,150.0 350.3,150.0", lines["dead letters"])
	require.Contains(t, lines, "failing webhooks")
}

// The partition table is folded behind its summary; a lease run out or a
// partition without a holder makes the summary stand out.
func TestPartitionsFoldedBehindTheirSummary(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	e.login(t, c)
	e.exec(t, `INSERT INTO outbox_forwarders (id, heartbeat_at) VALUES ('fwd-a', now()), ('fwd-b', now())`)
	e.exec(t, `INSERT INTO outbox_partitions (partition, owner, lease_until, published_total)
		SELECT g, CASE WHEN g < 2 THEN 'fwd-a' ELSE 'fwd-b' END, now() + interval '1 minute', CASE g WHEN 0 THEN 120000 ELSE 0 END
		FROM generate_series(0, 3) g`)
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)
	require.Regexp(t, `(?s)<details id="partitions-fold">\s*<summary id="partitions-summary">4 partitions: 4 leased by 2 forwarders, 1 with all 120,000 published; none stale</summary>.*<table id="partitions">.*</table></div></details>`, body)

	e.exec(t, `UPDATE outbox_partitions SET lease_until = now() - interval '1 minute' WHERE partition = 3`)
	e.exec(t, `UPDATE outbox_partitions SET owner = NULL, lease_until = NULL WHERE partition = 2`)
	e.exec(t, `UPDATE outbox_partitions SET published_total = 10 WHERE partition = 1`)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/fragments/overview", nil)
	requireText(t, body, "partitions-summary",
		"4 partitions: 2 leased by 1 forwarder, 2 sharing 120,010 published; 1 stale lease (run out, not renewed), 1 without a holder")
	require.Contains(t, body, `<summary id="partitions-summary" class="attention">`)
}

// A sample's reads are bounded as the overview's: with the webhook
// attempts' table locked, a sample ends within ReadTimeout (and a little),
// says which read it lost, and is kept with the rest of what it read.
func TestSampleIsBoundedByReadTimeout(t *testing.T) {
	t.Parallel()
	e, clk, _ := healthEnv(t, stalls)
	e.sample(t, clk, -time.Minute) // places the attempts' cursor
	ctx := context.Background()
	locker, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(ctx) })
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `LOCK TABLE webhook_endpoint_attempts IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	clk.set(0)
	done := make(chan error, 1)
	go func() { done <- e.console.Sample(ctx) }()
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		require.NoError(t, tx.Rollback(ctx))
		<-done
		t.Fatal("the sample waited on the lock past ReadTimeout (700 ms)")
	}
	require.ErrorContains(t, err, "webhook attempts")
	require.Equal(t, 2, console.HistoryLen(e.console), "the sample is kept, without the attempts")
}
