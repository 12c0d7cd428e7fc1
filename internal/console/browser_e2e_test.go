package console_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/outflowtest"
)

// startConsole serves the console of the stack's schema on a port of its
// own, with its sampler running, as `outflow serve --roles console` does. The cookie is not Secure:
// the browser reaches it over plain HTTP on 127.0.0.1.
func (s *stack) startConsole(t *testing.T) string {
	t.Helper()
	lag, _ := s.backend.(brokers.LagReporter) // Redis Streams reports it: the overview shows each group's lag
	h, err := console.New(console.Config{Pool: s.schema.Pool, Logger: quiet, InsecureCookie: true, Lag: lag, ReadTimeout: loadedReadTimeout,
		Consumers: []console.Consumer{
			{Name: "sync-analytics", Topic: app.PaymentsTopic},
			{Name: "notify-merchant", Topic: app.PaymentsTopic},
			{Name: "ledger-export", Topic: app.PaymentsTopic},
		}})
	require.NoError(t, err)
	goRun(t, h.Run) // the published rate's sampler, as the console role runs it
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	// A node found while the page it belongs to is being replaced (a form
	// posted, the answer rendering) is gone by the time its text is asked
	// for ("No node with given id found"): ask again, on the page that
	// stays.
	var (
		s       string
		lastErr error
	)
	outflowtest.WaitFor(t, 30*time.Second, "the text of "+sel, func() bool {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, lastErr = chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
		return lastErr == nil || ctx.Err() != nil
	})
	require.NoError(t, lastErr, "text of %s", sel)
	return strings.TrimSpace(s)
}

// The operator's path through the console, in headless Chromium against a
// running pipeline: log in with the admin key, read the overview (its
// numbers are the database's), find the parked row, retry it (confirmed)
// and see the forwarder publish it, and open a dead letter's event journey.
// Every page is screenshotted into the test's artifacts.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel() // beside the other browser tests: each has its own tab of the shared Chromium, database and servers
	s := startStack(t)
	seed := s.seed(t)
	base := s.startConsole(t)
	ctx := newBrowser(t)
	t.Run("the harness", func(t *testing.T) { checkHarness(t, ctx, s) })
	dir := artifactsDir(t)
	pool := s.schema.Pool
	bg := context.Background()

	// Login: a page without a session goes to the login form.
	run(t, ctx, "open the console", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#api-key")))
	screenshot(t, ctx, dir, "01-login")
	run(t, ctx, "log in with the admin key",
		chromedp.SetValue(chromedp.CSS("#api-key"), s.adminKey),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#overview")),
	)

	// Overview: the numbers shown are the database's.
	var parked, dead int
	require.NoError(t, pool.QueryRow(bg, `SELECT count(*) FROM outbox_failures WHERE parked_at IS NOT NULL`).Scan(&parked))
	require.NoError(t, pool.QueryRow(bg,
		`SELECT count(*) FROM dead_letters WHERE consumer = 'ledger-export' AND status = 'dead'`).Scan(&dead))
	require.Equal(t, strconv.Itoa(parked), text(t, ctx, "#outbox-parked"), "parked rows on the overview")
	require.Equal(t, strconv.Itoa(dead), text(t, ctx, `tr.consumer[data-consumer="ledger-export"] td.dead`),
		"ledger-export's dead letters on the overview")
	partitions, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("#partitions tr.partition td.owner")).map(td => td.textContent.trim())`))
	require.NoError(t, err)
	require.Len(t, partitions, 2, "the forwarder's partitions on the overview")
	for _, owner := range partitions {
		require.NotEqual(t, "none", owner, "each partition's lease holder")
	}
	screenshot(t, ctx, dir, "02-overview")

	// The parked row: listed, retried through the confirmation step.
	var rowID int64
	require.NoError(t, pool.QueryRow(bg, `SELECT id FROM outbox_failures WHERE aggregate_id = $1 AND parked_at IS NOT NULL`,
		seed.parked).Scan(&rowID))
	row := fmt.Sprintf("#parked-%d", rowID)
	run(t, ctx, "open the parked rows", chromedp.Navigate(base+"/parked"), chromedp.WaitVisible(chromedp.CSS(row)))
	screenshot(t, ctx, dir, "03-parked")
	s.broker.setRefused(seed.parked, false) // the cause is fixed: the broker takes it now
	run(t, ctx, "select the row", chromedp.Click(chromedp.CSS(row+` input[name="id"]`)))
	screenshot(t, ctx, dir, "04-parked-selected")
	confirmed := answerDialog(t, ctx, true)
	run(t, ctx, "retry it, confirming in the browser's dialog",
		chromedp.Click(chromedp.CSS("#parked-retry-selected")),
		chromedp.WaitVisible(chromedp.CSS("#action-result")),
	)
	require.Contains(t, received(t, confirmed), "Retry", "the confirmation asked")
	require.Contains(t, text(t, ctx, "#action-result"), "1", "the retry's result count")
	screenshot(t, ctx, dir, "05-retried")

	// The forwarder publishes it; its journey shows when.
	outflowtest.WaitFor(t, 30*time.Second, "the retried row published", func() bool {
		var published bool
		require.NoError(t, pool.QueryRow(bg, `SELECT published FROM outbox_state WHERE id = $1`, rowID).Scan(&published))
		return published
	})
	event := fmt.Sprintf("#event-%d", rowID)
	run(t, ctx, "open the retried payment's journey",
		chromedp.Navigate(base+"/journey?q="+url.QueryEscape(seed.parked)),
		chromedp.WaitVisible(chromedp.CSS(event)))
	require.NotEqual(t, "pending", text(t, ctx, event+" .published-at"), "the retried row's published_at on its journey")
	screenshot(t, ctx, dir, "06-journey-forwarded")

	// Another parked row, a payment.paid given up on: discarded from the
	// list (the button's formaction, confirmed in the browser's dialog);
	// the forwarder publishes its discard marker in its place, which the
	// broker takes where it refused the event, and the consumers take in
	// without running their handler: the merchant is not notified.
	var (
		discardID  int64
		discardMsg string
	)
	require.NoError(t, pool.QueryRow(bg, `SELECT o.id, o.message_id::text FROM outbox o JOIN outbox_failures f USING (id)
		WHERE o.aggregate_id = $1 AND f.parked_at IS NOT NULL AND o.event_type = 'payment.paid'`, seed.discard).Scan(&discardID, &discardMsg))
	row = fmt.Sprintf("#parked-%d", discardID)
	run(t, ctx, "open the parked rows again", chromedp.Navigate(base+"/parked"), chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Click(chromedp.CSS(row+` input[name="id"]`)))
	confirmed = answerDialog(t, ctx, true)
	run(t, ctx, "discard it, confirming in the browser's dialog",
		chromedp.Click(chromedp.CSS("#parked-discard-selected")),
		chromedp.WaitVisible(chromedp.CSS("#action-result")),
	)
	require.Contains(t, received(t, confirmed), "Discard 1 parked row of topic payments?", "the discard button's own question: the count and the target")
	require.Contains(t, text(t, ctx, "#action-result"), "outbox.discard", "the discard's result")
	require.Equal(t, "1", text(t, ctx, "#action-count"))
	screenshot(t, ctx, dir, "06b-parked-discarded")
	outflowtest.WaitFor(t, 30*time.Second, "the discarded row's marker published", func() bool {
		var published bool
		require.NoError(t, pool.QueryRow(bg, `SELECT published FROM outbox_state WHERE id = $1`, discardID).Scan(&published))
		return published
	})
	// (Published, the row left outbox_failures, and with it its
	// discarded_at: since 00025 the outbox keeps none. That it went out as
	// its marker shows below: taken in, the merchant not notified.)
	outflowtest.WaitFor(t, 30*time.Second, "the marker taken in by the three consumers", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(bg, `SELECT count(*) FROM consumer_aggregate_versions v JOIN outbox o
			ON o.aggregate_type = v.aggregate_type AND o.aggregate_id = v.aggregate_id
			WHERE o.message_id = $1 AND v.version >= o.aggregate_version`, discardMsg).Scan(&n))
		return n == 3
	})
	// In the framework's webhook tables, and in the app's former ones
	// while they are there (the handover queue of the switch to them).
	for table, q := range map[string]string{
		"webhook_messages":   `SELECT count(*) FROM webhook_messages WHERE id = $1`,
		"webhook_deliveries": `SELECT count(*) FROM webhook_deliveries WHERE message_id = $1`,
	} {
		var there bool
		require.NoError(t, pool.QueryRow(bg, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&there))
		if !there {
			continue
		}
		var notified int
		require.NoError(t, pool.QueryRow(bg, q, discardMsg).Scan(&notified))
		require.Zero(t, notified, "%s: notify-merchant's handler did not run for the discarded payment.paid", table)
	}

	// A dead letter: listed, and its event's journey found from the search form.
	// Its status is named: an event that reached the consumer before its
	// predecessor has a held row, which may be the payment's first.
	var deadID int64
	require.NoError(t, pool.QueryRow(bg, `SELECT id FROM dead_letters WHERE consumer = 'ledger-export' AND aggregate_id = $1
		AND status = 'dead' ORDER BY id LIMIT 1`, seed.dead).Scan(&deadID))
	run(t, ctx, "open the dead letters",
		chromedp.Navigate(base+"/dead?consumer=ledger-export"),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf("#dead-%d", deadID))))
	screenshot(t, ctx, dir, "07-dead")
	run(t, ctx, "follow the dead letter to its event's journey",
		chromedp.Click(chromedp.CSS(fmt.Sprintf("#dead-%d a.journey-link", deadID))),
		chromedp.WaitVisible(chromedp.CSS(`#journey tr.outcome[data-consumer="ledger-export"][data-status="dead"]`)),
	)
	journey := text(t, ctx, "#journey")
	require.Contains(t, journey, seed.dead, "the dead letter's payment, on the journey")
	require.Contains(t, journey, "account closed", "the dead letter's error, on the journey")
	screenshot(t, ctx, dir, "08-journey-dead-letter")

	// The same stack and browser: without JavaScript, then on a phone.
	t.Run("without JavaScript the server asks", func(t *testing.T) {
		confirmWithoutJS(t, ctx, base, dir, pool, deadID)
	})
	t.Run("on a phone", func(t *testing.T) {
		onAPhone(t, ctx, base, dir, seed)
	})
}

// confirmWithoutJS discards a dead letter with scripts disabled: the
// button's form goes to the server, which answers its confirmation page
// (what the action does, on which rows); cancel changes nothing, confirm
// discards it and lands on the list with the result.
func confirmWithoutJS(t *testing.T, ctx context.Context, base, dir string, pool *pgxpool.Pool, deadID int64) {
	bg := context.Background()
	_, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: false})
		require.NoError(t, err)
	})
	status := func() string {
		var s string
		require.NoError(t, pool.QueryRow(bg, `SELECT status FROM dead_letters WHERE id = $1`, deadID).Scan(&s))
		return s
	}
	actions := func() int {
		var n int
		require.NoError(t, pool.QueryRow(bg, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'dlq.discard'`).Scan(&n))
		return n
	}
	require.Equal(t, "dead", status())
	list := base + "/dead?consumer=ledger-export&status=dead"
	row := fmt.Sprintf("#dead-%d", deadID)
	toConfirm := []chromedp.Action[chromedp.Void]{
		chromedp.Navigate(list),
		chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Click(chromedp.CSS(row + ` input[name="id"]`)),
		chromedp.Click(chromedp.CSS("#dead-discard-selected")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-form")),
	}

	run(t, ctx, "discard it: the server's confirmation page", toConfirm...)
	require.Contains(t, text(t, ctx, "#confirm-what"), "Discard dead letters", "the confirmation says what it does")
	require.Equal(t, fmt.Sprintf("#%d", deadID), text(t, ctx, "#confirm-ids"), "and on which rows")
	screenshot(t, ctx, dir, "09-confirm-without-js")
	run(t, ctx, "cancel", chromedp.Click(chromedp.CSS("#confirm-cancel")), chromedp.WaitVisible(chromedp.CSS(row)))
	require.Equal(t, list, location(t, ctx), "cancel goes back to the list")
	require.Equal(t, "dead", status(), "cancel changes nothing")
	require.Zero(t, actions(), "cancel records nothing")

	run(t, ctx, "discard it again, and confirm", append(toConfirm,
		chromedp.Click(chromedp.CSS("#confirm-submit")),
		chromedp.WaitVisible(chromedp.CSS("#action-result")))...)
	require.Contains(t, text(t, ctx, "#action-result"), "dlq.discard", "the result, on the list")
	require.Equal(t, "1", text(t, ctx, "#action-count"))
	back, err := url.Parse(location(t, ctx))
	require.NoError(t, err)
	require.Equal(t, "/dead", back.Path, "back on the list")
	require.Equal(t, "ledger-export", back.Query().Get("consumer"), "with its filter")
	require.Equal(t, "dead", back.Query().Get("status"), "with its filter")
	require.Equal(t, "discarded", status(), "the dead letter is discarded")
	require.Equal(t, 1, actions(), "the action is recorded")
	screenshot(t, ctx, dir, "10-discarded-without-js")
}

// onAPhone reads the overview, a journey, the dead letters, the parked
// rows and the actions on a phone's viewport (390 px, and the narrowest
// common one, 320 px): none is wider than the screen (a table scrolls
// inside its own box).
func onAPhone(t *testing.T, ctx context.Context, base, dir string, seed seeded) {
	t.Cleanup(func() { run(t, ctx, "back to the laptop", chromedp.ResetViewport()) })
	for _, phone := range []struct{ width, height int64 }{{390, 844}, {320, 640}} {
		run(t, ctx, "a phone's viewport",
			chromedp.EmulateViewport(phone.width, phone.height, chromedp.EmulateMobile, chromedp.EmulatePortrait))
		for _, pg := range []struct{ name, path, sel string }{
			{"overview", "/", "#partitions-fold"},
			{"journey", "/journey?q=" + url.QueryEscape(seed.dead), "#journey"},
			{"dead", "/dead?consumer=ledger-export", "#dead-form"},
			{"parked", "/parked", "#parked-form"},
			{"actions", "/actions", "#actions"},
		} {
			run(t, ctx, "open "+pg.path, chromedp.Navigate(base+pg.path), chromedp.WaitVisible(chromedp.CSS(pg.sel)))
			sizes, err := chromedp.Run(ctx, chromedp.Evaluate[[]int64](
				`[window.innerWidth, document.documentElement.scrollWidth]`))
			require.NoError(t, err)
			// A mobile browser widens its viewport to a page wider than the
			// screen (and zooms out): innerWidth says so too.
			require.Equal(t, phone.width, sizes[0], "%s at %d px: the page's viewport is the phone's", pg.path, phone.width)
			require.LessOrEqual(t, sizes[1], phone.width, "%s at %d px: the page is not wider than the phone", pg.path, phone.width)
			screenshot(t, ctx, dir, fmt.Sprintf("11-phone-%d-%s", phone.width, pg.name))
		}
	}
}

// location is the page's URL.
func location(t *testing.T, ctx context.Context) string {
	t.Helper()
	u, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	return u
}
