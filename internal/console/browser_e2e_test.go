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

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/outflowtest"
)

// startConsole serves the console of the stack's schema on a port of its
// own, as `outflow serve --roles console` does. The cookie is not Secure:
// the browser reaches it over plain HTTP on 127.0.0.1.
func (s *stack) startConsole(t *testing.T) string {
	t.Helper()
	lag, _ := s.backend.(brokers.LagReporter) // Redis Streams reports it: the overview shows each group's lag
	h, err := console.New(console.Config{Pool: s.schema.Pool, Logger: quiet, InsecureCookie: true, Lag: lag,
		Consumers: []console.Consumer{
			{Name: "sync-analytics", Topic: app.PaymentsTopic},
			{Name: "notify-merchant", Topic: app.PaymentsTopic},
			{Name: "ledger-export", Topic: app.PaymentsTopic},
		}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err, "text of %s", sel)
	return strings.TrimSpace(s)
}

// The operator's path through the console, in headless Chromium against a
// running pipeline: log in with the admin key, read the overview (its
// numbers are the database's), find the parked row, retry it (confirmed)
// and see the forwarder publish it, and open a dead letter's event journey.
// Every page is screenshotted into the test's artifacts.
func TestConsoleInBrowser(t *testing.T) {
	s := startStack(t)
	seed := s.seed(t)
	base := s.startConsole(t)
	ctx := newBrowser(t)
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
	require.NoError(t, pool.QueryRow(bg, `SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL`).Scan(&parked))
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
	require.NoError(t, pool.QueryRow(bg, `SELECT id FROM outbox WHERE aggregate_id = $1 AND parked_at IS NOT NULL`,
		seed.parked).Scan(&rowID))
	row := fmt.Sprintf("#parked-%d", rowID)
	run(t, ctx, "open the parked rows", chromedp.Navigate(base+"/parked"), chromedp.WaitVisible(chromedp.CSS(row)))
	screenshot(t, ctx, dir, "03-parked")
	s.broker.setRefused(seed.parked, false) // the cause is fixed: the broker takes it now
	run(t, ctx, "select the row", chromedp.Click(chromedp.CSS(row+` input[name="id"]`)))
	screenshot(t, ctx, dir, "04-parked-selected")
	confirmed := acceptDialogs(t, ctx)
	run(t, ctx, "retry it, confirming in the browser's dialog",
		chromedp.Click(chromedp.CSS("#parked-retry-selected")),
		chromedp.WaitVisible(chromedp.CSS("#action-result")),
	)
	require.Contains(t, <-confirmed, "Retry", "the confirmation asked")
	require.Contains(t, text(t, ctx, "#action-result"), "1", "the retry's result count")
	screenshot(t, ctx, dir, "05-retried")

	// The forwarder publishes it; its journey shows when.
	outflowtest.WaitFor(t, 30*time.Second, "the retried row published", func() bool {
		var published bool
		require.NoError(t, pool.QueryRow(bg, `SELECT published_at IS NOT NULL FROM outbox WHERE id = $1`, rowID).Scan(&published))
		return published
	})
	event := fmt.Sprintf("#event-%d", rowID)
	run(t, ctx, "open the retried payment's journey",
		chromedp.Navigate(base+"/journey?q="+url.QueryEscape(seed.parked)),
		chromedp.WaitVisible(chromedp.CSS(event)))
	require.NotEqual(t, "pending", text(t, ctx, event+" .published-at"), "the retried row's published_at on its journey")
	screenshot(t, ctx, dir, "06-journey-forwarded")

	// A dead letter: listed, and its event's journey found from the search form.
	var deadID int64
	require.NoError(t, pool.QueryRow(bg, `SELECT id FROM dead_letters WHERE consumer = 'ledger-export' AND aggregate_id = $1
		ORDER BY id LIMIT 1`, seed.dead).Scan(&deadID))
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
}

// acceptDialogs accepts the next JavaScript dialog (the console's confirm())
// and sends its message on the channel it returns.
func acceptDialogs(t *testing.T, ctx context.Context) <-chan string {
	t.Helper()
	dctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	dialogs := chromedp.Events(dctx, page.JavascriptDialogOpening)
	msg := make(chan string, 1)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(dctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			msg <- ev.Message
			return
		}
	}()
	return msg
}
