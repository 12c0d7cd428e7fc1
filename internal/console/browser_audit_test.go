package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/internal/actionlog"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The audit in a browser, at 1280 and 390 px: the Actions page lists a
// CLI action (its user@host and command line) beside a console one (its
// key), each target a link (a parked row to its message's journey, a
// consumer to its dead letters, an aggregate to its journey), filtered by
// selects of what exists, paged First/Newer/Older with a total; and a
// payment's journey lists its replays. At 390 px neither page is wider than
// the screen.
func TestAuditInBrowser(t *testing.T) {
	t.Parallel() // beside the other browser tests: each has its own tab of the shared Chromium, database and servers
	rc := testservers.Redis(t)
	broker, err := redisstreams.New(redisstreams.Config{Client: rc, StreamPrefix: testservers.UniqueName(t, rc)})
	require.NoError(t, err)
	e := newEnv(t, func(c *console.Config) { c.Broker = broker }) // PageSize 2: the pager shows
	ctx := context.Background()
	pay := "0190c0de-0000-7000-8000-00000000a0d1"
	e.insertOutbox(t, pay, 1, true, false)
	e.insertOutbox(t, pay, 2, true, false)
	parked := e.insertOutbox(t, "0190c0de-0000-7000-8000-00000000a0d2", 1, false, true)
	var parkedMsg string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT message_id::text FROM outbox WHERE id = $1`, parked).Scan(&parkedMsg))

	cli := actionlog.Actor{Kind: actionlog.CLI, ID: "alice@bastion-1", Name: "alice"}
	insert := func(en actionlog.Entry) {
		t.Helper()
		_, err := actionlog.Insert(ctx, e.pool, en)
		require.NoError(t, err)
	}
	console := actionlog.Actor{Kind: actionlog.Console, ID: e.adminID, Name: "ops"}
	insert(actionlog.Entry{Actor: console, Action: "replay", Count: 2, AggregateType: "payment", AggregateID: pay,
		Target: map[string]string{"consumer": "notify-merchant", "aggregate_type": "payment", "aggregate_id": pay}})
	cli.Command = "outflow replay --aggregate-id=" + pay + " --aggregate-type=payment --consumer=analytics --yes"
	insert(actionlog.Entry{Actor: cli, Action: "replay", Count: 2, AggregateType: "payment", AggregateID: pay,
		Target: map[string]string{"consumer": "analytics", "aggregate_type": "payment", "aggregate_id": pay, "source": "outbox"}})
	cli.Command = "outflow dlq retry --all"
	insert(actionlog.Entry{Actor: cli, Action: "dlq.retry", Count: 3, Target: map[string]any{"all": true, "consumer": "analytics"}})

	// A console action, through the console: the newest.
	c := e.client(t)
	res, body := do(t, c, http.MethodPost, e.srv.URL+"/parked/retry",
		url.Values{"csrf_token": {e.login(t, c)}, "id": {strconv.FormatInt(parked, 10)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)

	b := newBrowser(t)
	dir := artifactsDir(t)
	run(t, b, "log in", chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#api-key")),
		chromedp.SetValue(chromedp.CSS("#api-key"), e.adminKey), chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#overview")))

	// The newest page: the console's retry and the CLI's dlq retry.
	run(t, b, "the actions", chromedp.Navigate(e.srv.URL+"/actions"), chromedp.WaitVisible(chromedp.CSS("#actions")))
	require.Equal(t, "4 action(s); newest first.", text(t, b, "#actions-total"))
	rows := attrs(t, b, "#actions tr.action", "data-kind")
	require.Equal(t, []string{"console", "cli"}, rows)
	require.Contains(t, text(t, b, "#actions tr.action:nth-child(1) td.who"), "ops")
	require.Contains(t, text(t, b, "#actions tr.action:nth-child(2) td.who"), "alice@bastion-1")
	require.Equal(t, "outflow dlq retry --all", text(t, b, "#actions tr.action:nth-child(2) code.command"))
	require.Equal(t, []string{"/journey?q=" + parkedMsg, "/dead?consumer=analytics"}, attrs(t, b, "#actions a.target-link", "href"))
	screenshot(t, b, dir, "01-actions-1280")

	// Older, then Newer and First.
	run(t, b, "older", chromedp.Click(chromedp.CSS("#actions-older")), chromedp.WaitVisible(chromedp.CSS("#actions-first")))
	require.Equal(t, []string{"cli", "console"}, attrs(t, b, "#actions tr.action", "data-kind"))
	require.Equal(t, []string{"/dead?consumer=analytics", "/journey?q=" + pay, "/dead?consumer=notify-merchant", "/journey?q=" + pay},
		attrs(t, b, "#actions a.target-link", "href"))
	run(t, b, "newer", chromedp.Click(chromedp.CSS("#actions-newer")), chromedp.WaitVisible(chromedp.CSS("#actions-older")))
	require.Equal(t, []string{"console", "cli"}, attrs(t, b, "#actions tr.action", "data-kind"))

	// The filter's selects hold what exists; choosing narrows the list
	// and its total.
	require.Equal(t, []string{"", "dlq.retry", "outbox.retry", "replay"}, attrs(t, b, "#actions-action option", "value"))
	// (Each choice applies at once: the page reloads with it.)
	for _, f := range []struct{ sel, value string }{{"#actions-kind", "cli"}, {"#actions-action", "replay"}} {
		scripted(t, b)
		run(t, b, "filter: "+f.value, chromedp.SetValue(chromedp.CSS(f.sel), f.value))
		outflowtest.WaitFor(t, 10*time.Second, "the filter "+f.value+" applied", func() bool {
			return strings.Contains(location(t, b), "="+f.value)
		})
		run(t, b, "the filtered list", chromedp.WaitVisible(chromedp.CSS(`#actions-total`)))
	}
	require.Equal(t, "1 action(s) matching the filter; newest first.", text(t, b, "#actions-total"))
	require.Contains(t, location(t, b), "kind=cli")

	// The payment's journey lists its replays, newest first.
	run(t, b, "the journey", chromedp.Navigate(e.srv.URL+"/journey?q="+pay), chromedp.WaitVisible(chromedp.CSS("#journey-replays")))
	require.Equal(t, []string{"analytics", "notify-merchant"}, attrs(t, b, "#journey-replays tr.replay", "data-consumer"))
	require.Contains(t, text(t, b, "#journey-replays tr.replay:nth-child(1)"), "alice@bastion-1")
	screenshot(t, b, dir, "02-journey-replays-1280")

	// Replaying it: no consumer is chosen for the operator, and the
	// question names the count and the consumer chosen.
	require.Empty(t, value(t, b, "#replay-consumer"), "no consumer chosen by default")
	confirmed := answerDialog(t, b, false)
	run(t, b, "replay to notify-merchant, then decline", chromedp.SetValue(chromedp.CSS("#replay-consumer"), "notify-merchant"),
		chromedp.Click(chromedp.CSS("#replay-submit")))
	require.Equal(t, "Replay 2 events of payment "+pay+" to consumer notify-merchant?", received(t, confirmed))
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'replay'`), "declined: nothing done")

	// A phone.
	t.Cleanup(func() { run(t, b, "back to the laptop", chromedp.ResetViewport()) })
	run(t, b, "a phone's viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait))
	for _, pg := range []struct{ name, path, sel, box string }{
		{"actions", "/actions", "#actions", "div.scroll:has(> #actions)"},
		{"journey-replays", "/journey?q=" + pay, "#journey-replays", "#journey-replays .scroll"},
	} {
		run(t, b, "open "+pg.path, chromedp.Navigate(e.srv.URL+pg.path), chromedp.WaitVisible(chromedp.CSS(pg.sel)))
		sizes, err := chromedp.Run(b, chromedp.Evaluate[[]int64](`[window.innerWidth, document.documentElement.scrollWidth,
			document.querySelector('`+pg.box+`').scrollWidth]`))
		require.NoError(t, err)
		require.EqualValues(t, 390, sizes[0], pg.path)
		require.LessOrEqual(t, sizes[1], int64(390), "%s: the page is not wider than the phone", pg.path)
		require.LessOrEqual(t, sizes[2], int64(390), "%s: nor its table, which reads without scrolling sideways", pg.path)
		screenshot(t, b, dir, fmt.Sprintf("03-%s-390", pg.name))
	}
}

// value is the value of the form field sel.
func value(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(sel)))
	require.NoError(t, err)
	return v
}

// attrs is the attribute name of every element sel matches, in order.
func attrs(t *testing.T, ctx context.Context, sel, name string) []string {
	t.Helper()
	js := fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).map(e => e.getAttribute(%q))`, sel, name)
	out, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](js))
	require.NoError(t, err, "%s %s", sel, name)
	return out
}
