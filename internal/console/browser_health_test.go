package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Health at a glance, in Chromium at 1280 and 390 px: an overview in
// trouble (a stuck outbox, parked rows, dead letters, failing and dead
// webhooks, a lagging consumer, a stale lease) says failing and why, its
// problems in colour and its zeros muted, its charts drawn, its partition
// table folded (and left open across refreshes once opened); the
// webhooks' counts lead to their list, a delivery to its endpoint's page,
// whose test event is sent through the confirmation; on a phone the key columns stay on
// screen. A healthy overview says so.
func TestHealthAtAGlanceInBrowser(t *testing.T) {
	t.Parallel() // beside the other browser tests: each has its own tab of the shared Chromium, database and servers
	trouble, clk, _ := healthEnv(t, func(c *console.Config) {
		c.Lag = staticLag{"analytics": {Events: 12500, OldestAge: 8 * time.Minute}, "notify-merchant": {}}
	})
	// An hour of samples, the trouble growing over the last half.
	trouble.exec(t, `INSERT INTO outbox_forwarders (id, heartbeat_at) VALUES ('fwd-a', now()), ('fwd-b', now() - interval '5 minutes')`)
	trouble.exec(t, `INSERT INTO outbox_partitions (partition, owner, lease_until, published_total)
		SELECT g, CASE WHEN g = 15 THEN 'fwd-b' ELSE 'fwd-a' END,
		       CASE WHEN g = 15 THEN now() - interval '4 minutes' ELSE now() + interval '10 seconds' END, 0
		FROM generate_series(0, 15) g`)
	published := int64(0)
	for i := range 12 {
		at := time.Duration(i-12) * 5 * time.Minute
		published += int64(1500 + 600*(i%4))
		trouble.exec(t, `UPDATE outbox_partitions SET published_total = $1 WHERE partition = 0`, published)
		if i >= 6 {
			trouble.insertOutbox(t, fmt.Sprint("parked-", i), 1, false, true)
			trouble.insertDead(t, "notify-merchant", fmt.Sprintf("00000000-0000-0000-0000-%012d", i), fmt.Sprint("d-", i), 1, "dead")
			trouble.insertDelivery(t, "pending", 3, "HTTP 500 from https://merchant.example/hooks")
		}
		if i == 10 {
			trouble.insertDead(t, "analytics", "00000000-0000-0000-0000-0000000000aa", "held-1", 2, "held")
			trouble.insertDead(t, "analytics", "00000000-0000-0000-0000-0000000000ab", "r-1", 1, "retrying")
			trouble.insertDelivery(t, "dead", 9, "HTTP 410 Gone")
		}
		trouble.sample(t, clk, at)
	}
	trouble.exec(t, `INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at, created_at)
		VALUES (gen_random_uuid(), 'payments', 'payment', 'stuck', 1, 'payment.paid', '{}', now(), now() - interval '12 minutes')`)
	trouble.sample(t, clk, -time.Minute)
	clk.set(0)

	healthy, hclk, _ := healthEnv(t, func(c *console.Config) { c.Lag = staticLag{} })
	healthy.exec(t, `INSERT INTO outbox_forwarders (id, heartbeat_at) VALUES ('fwd-a', now())`)
	healthy.exec(t, `INSERT INTO outbox_partitions (partition, owner, lease_until, published_total)
		SELECT g, 'fwd-a', now() + interval '1 hour', 100 * g FROM generate_series(0, 3) g`)
	for i := range 6 {
		healthy.exec(t, `UPDATE outbox_partitions SET published_total = published_total + 300`)
		healthy.sample(t, hclk, time.Duration(i-6)*time.Minute)
	}
	hclk.set(0)

	// The trouble's server counts its refreshes: the fold's test waits for
	// one.
	var fragments atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/fragments/") {
			defer fragments.Add(1)
		}
		trouble.console.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	ctx := newBrowser(t)
	dir := artifactsDir(t)
	login := func(base, key string) {
		run(t, ctx, "log in", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#api-key")),
			chromedp.SetValue(chromedp.CSS("#api-key"), key), chromedp.Click(chromedp.CSS("#login-submit")),
			chromedp.WaitVisible(chromedp.CSS("#health")))
	}
	color := func(sel string) string {
		c, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`getComputedStyle(document.querySelector(%q)).color`, sel)))
		require.NoError(t, err, sel)
		return c
	}
	const bad, muted = "rgb(179, 38, 30)", "rgb(102, 112, 122)"

	login(srv.URL, trouble.adminKey)
	require.Equal(t, "FAILING", text(t, ctx, "#health-state"), "in capitals, as the CSS writes it")
	why := text(t, ctx, "#health-why")
	for _, want := range []string{
		"failing: outbox oldest pending 12 min (> 5 min, OutflowOutboxStuck; for 1 min, the alert waits 5 min)",
		"failing: analytics (payments) oldest unhandled event 8 min (> 5 min, OutflowConsumerLagging; for 1 h)",
		"degraded: 6 outbox rows parked (> 0, OutflowOutboxParked; for 30 min)",
		"degraded: 2 new dead letters of notify-merchant in the last 15 min",
		"degraded: 1 webhook delivery dead in the last 15 min",
	} {
		require.Contains(t, why, want)
	}
	require.Equal(t, bad, color("#health-state"))
	require.Equal(t, bad, color("#outbox-parked a"))
	require.Equal(t, bad, color(`tr[data-consumer="notify-merchant"] td.dead a`))
	require.Equal(t, muted, color(`tr[data-consumer="notify-merchant"] td.held span`))
	require.Equal(t, "12,500 events, oldest 8 min", text(t, ctx, `tr[data-consumer="analytics"] td.lag`))
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("svg.chart polyline.series").length`))
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 5, "the rate, two lags and three failures drawn")
	require.Equal(t, "16 partitions: 15 leased by 1 forwarder, 1 with all 28,800 published; 1 stale lease (run out, not renewed)",
		text(t, ctx, "#partitions-summary"))
	require.Equal(t, bad, color("#partitions-summary"))
	table, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!document.querySelector("#partitions").checkVisibility()`))
	require.NoError(t, err)
	require.True(t, table, "the partition table is folded")
	screenshot(t, ctx, dir, "01-trouble-1280")

	// Opened, the fold stays open across the live refresh (which replaces
	// the overview's markup, the <details> with it).
	folded := func() bool {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
			`!(document.querySelector("#partitions-fold").open && document.querySelector("#partitions").checkVisibility())`))
		require.NoError(t, err)
		return v
	}
	clickInPage(t, ctx, "#partitions-summary") // open the partitions
	outflowtest.WaitFor(t, 10*time.Second, "the partition table shown", func() bool { return !folded() })
	seen := fragments.Load()
	outflowtest.WaitFor(t, 20*time.Second, "two refreshes", func() bool { return fragments.Load() >= seen+2 })
	require.False(t, folded(), "the partitions still open after the refreshes")
	screenshot(t, ctx, dir, "02-trouble-partitions-open-1280")
	clickInPage(t, ctx, "#partitions-summary") // fold again
	outflowtest.WaitFor(t, 10*time.Second, "the partition table folded", folded)

	// A phone: no wider than the screen, the consumers' key columns on it.
	run(t, ctx, "a phone's viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait))
	t.Cleanup(func() { run(t, ctx, "back to the laptop", chromedp.ResetViewport()) })
	run(t, ctx, "reload", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#health")))
	sizes, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`[window.innerWidth, document.documentElement.scrollWidth,
		document.querySelector('tr[data-consumer="notify-merchant"] td.dead').getBoundingClientRect().right,
		document.querySelector('#consumers th.secondary').offsetParent === null ? 0 : 1]`))
	require.NoError(t, err)
	require.Equal(t, []float64{390}, sizes[:1])
	require.LessOrEqual(t, sizes[1], 390.0, "the page is not wider than the phone")
	require.LessOrEqual(t, sizes[2], 390.0, "the Dead column is on screen")
	require.Zero(t, sizes[3], "the topic column is hidden on a phone")
	screenshot(t, ctx, dir, "03-trouble-390")

	// The failing webhooks' count leads to their list.
	clickInPage(t, ctx, "#webhooks-failing a")
	run(t, ctx, "the failing webhooks", chromedp.WaitVisible(chromedp.CSS("#webhooks")))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#webhooks tr.webhook-row[data-status=failing]").length`))
	require.NoError(t, err)
	require.Equal(t, 2, rows, "a page of them (PageSize 2)")
	require.Contains(t, text(t, ctx, "#webhooks tr.webhook-row"), "HTTP 500")
	screenshot(t, ctx, dir, "04-webhooks-390")
	run(t, ctx, "the laptop", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(srv.URL+"/webhooks"), chromedp.WaitVisible(chromedp.CSS("#webhooks")))
	screenshot(t, ctx, dir, "05-webhooks-1280")
	// A delivery's endpoint, its page, and one action through the server's
	// confirmation (the form has no data-confirm): a test event, recorded.
	// A page the loaded machine could not read within ReadTimeout answers
	// 503: reloaded until it shows.
	shown := func(what, sel string) {
		outflowtest.WaitFor(t, 60*time.Second, what, func() bool {
			state, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
				`document.querySelector(%q) ? "shown" : (document.readyState === "complete" && document.body.innerText.includes("did not answer within") ? "503" : "")`, sel)))
			if err != nil { // the page navigating: asked again
				return false
			}
			if state == "503" {
				run(t, ctx, what+": reload", chromedp.Reload())
			}
			return state == "shown"
		})
	}
	run(t, ctx, "an endpoint's page", chromedp.Click(chromedp.CSS("#webhooks a.endpoint-link")))
	shown("the endpoint's page", "#endpoint")
	require.Equal(t, "https://merchant.example/hooks", text(t, ctx, "#endpoint-url"))
	run(t, ctx, "send a test event", chromedp.Click(chromedp.CSS("#endpoint-test")), chromedp.WaitVisible(chromedp.CSS("#confirm-submit")))
	run(t, ctx, "confirm it", chromedp.Click(chromedp.CSS("#confirm-submit")))
	shown("the action's result", "#action-result")
	require.Contains(t, text(t, ctx, "#action-result"), "webhook.test: 1 row(s)")
	screenshot(t, ctx, dir, "05b-webhook-endpoint-1280")

	// Healthy.
	login(healthy.srv.URL, healthy.adminKey)
	require.Equal(t, "HEALTHY", text(t, ctx, "#health-state"))
	require.Equal(t, "rgb(46, 125, 50)", color("#health-state"))
	require.Equal(t, muted, color("#outbox-parked span"))
	screenshot(t, ctx, dir, "06-healthy-1280")
	run(t, ctx, "a phone's viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait),
		chromedp.Navigate(healthy.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#health")))
	screenshot(t, ctx, dir, "07-healthy-390")
}
