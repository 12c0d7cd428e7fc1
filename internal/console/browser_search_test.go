package console_test

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

// In Chromium, at 1280 and 390 px: a pasted search link asks for the login
// and returns to the search; the search finds a merchant's events and its
// rows open their journey; the journey of a payment with a parked and a
// held event says parked (not pending) and what the held one waits
// behind, the outcome table's key columns on screen at 390 px.
func TestBrowserSearchAndJourney(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = 20 })
	const (
		merchant = "00000000-0000-0000-0000-0000000000a1"
		pay      = "0190c0de-0000-7000-8000-0000000000e1"
		other    = "0190c0de-0000-7000-8000-0000000000e2"
	)
	e.exec(t, `INSERT INTO merchants (id, name, webhook_url, webhook_secret) VALUES ($1, 'Acme', 'https://a.example', 's'),
		('00000000-0000-0000-0000-0000000000b2', 'Bolt', 'https://b.example', 's')`, merchant)
	e.exec(t, `INSERT INTO payments (id, merchant_id, amount, currency, status, version, created_at, updated_at) VALUES
		($1, $3, 100, 'EUR', 'paid', 4, now(), now()), ($2, '00000000-0000-0000-0000-0000000000b2', 100, 'EUR', 'paid', 1, now(), now())`,
		pay, other, merchant)
	now := time.Now().Add(-5 * time.Minute)
	e.insertEvent(t, "payment", other, 1, "payment.created", "payments", now)
	v1 := e.insertOutbox(t, pay, 1, true, false)
	v2 := e.insertOutbox(t, pay, 2, true, false)
	v3 := e.insertOutbox(t, pay, 3, true, false)
	e.insertOutbox(t, pay, 4, false, true) // parked
	_ = v1
	e.insertDead(t, "analytics", e.messageID(t, v2), pay, 2, "dead")
	e.insertHeld(t, "analytics", e.messageID(t, v3), pay, 3)

	ctx := newBrowser(t)
	dir := artifactsDir(t)
	base := e.srv.URL
	search := "/search?merchant=" + merchant
	run(t, ctx, "open a pasted search link", chromedp.Navigate(base+search), chromedp.WaitVisible(chromedp.CSS("#api-key")))
	require.Contains(t, location(t, ctx), "/login?next="+url.QueryEscape(search))
	run(t, ctx, "log in",
		chromedp.SetValue(chromedp.CSS("#api-key"), e.adminKey),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#search-results")),
	)
	require.Equal(t, base+search, location(t, ctx), "the login returned to the search")
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#search-results tr.search-row").length`))
	require.NoError(t, err)
	require.Equal(t, 4, rows, "the merchant's payment's four events, not the other merchant's")
	screenshot(t, ctx, dir, "search-1280")

	// A row opens its journey; the parked and held events say what is so.
	journey := "/journey?q=" + pay
	run(t, ctx, "open the journey", chromedp.Navigate(base+journey), chromedp.WaitVisible(chromedp.CSS("#journey")))
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#journey")))
	require.NoError(t, err)
	require.Contains(t, text, "no: parked, the forwarder does not send it until it is retried or discarded")
	require.Contains(t, text, "held behind version 2, which is dead: retry or discard it")
	require.NotContains(t, text, "arrived before version 2")
	screenshot(t, ctx, dir, "journey-1280")

	t.Cleanup(func() { run(t, ctx, "back to the laptop", chromedp.ResetViewport()) })
	run(t, ctx, "a phone's viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait))
	for _, pg := range []struct{ name, path, sel string }{
		{"search", search, "#search-results"},
		{"journey", journey, "#journey"},
	} {
		run(t, ctx, "open "+pg.path, chromedp.Navigate(base+pg.path), chromedp.WaitVisible(chromedp.CSS(pg.sel)))
		sizes, err := chromedp.Run(ctx, chromedp.Evaluate[[]int64](`[window.innerWidth, document.documentElement.scrollWidth]`))
		require.NoError(t, err)
		require.Equal(t, int64(390), sizes[0], pg.name)
		require.LessOrEqual(t, sizes[1], int64(390), "%s: the page is not wider than the phone", pg.name)
		screenshot(t, ctx, dir, "phone-390-"+pg.name)
	}
	// The key columns of each table are on screen, not scrolled off it:
	// the search's created, type, aggregate and state; the journey's
	// consumer, outcome, dead letter and error (what a held event waits
	// behind).
	for sel, path := range map[string]string{
		"#search-results tr.search-row td:not(.minor)":                                              search,
		`#event-` + fmt.Sprint(v3) + ` table.outcomes tr.outcome td:not(.minor):not(.processed-at)`: journey,
	} {
		run(t, ctx, "open "+path, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS("main")))
		right, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](
			`Array.from(document.querySelectorAll(`+"`"+sel+"`"+`)).map(td => td.getBoundingClientRect().right)`))
		require.NoError(t, err)
		require.NotEmpty(t, right, sel)
		for _, r := range right {
			require.LessOrEqual(t, r, 390.0, "%s: a key column off screen at 390 px (%v)", sel, right)
		}
	}
}
