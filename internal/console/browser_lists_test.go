package console_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

// evalAs runs js in the page and returns its value.
func evalAs[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	require.NoError(t, err, js)
	return v
}

// The lists in Chromium, at 1280 and 390 px: select-all ticks the page;
// the browser's confirm() names the count and the target, and answering
// no changes nothing; discard looks destructive (red on white, apart from
// the retries); the grouped errors filter the list; on a phone the key
// columns fit without scrolling sideways.
func TestListsInBrowser(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = 5 })
	var rows []int64
	for i := range 7 {
		errText := `pq: new row violates check constraint "ledger_amount_positive"`
		if i%3 == 2 {
			errText = "context deadline exceeded"
		}
		rows = append(rows, e.deadWithError(t, "sync-analytics", "dead", errText))
	}
	e.deadWithError(t, "notify-merchant", "dead", "endpoint answered 500")
	e.insertOutbox(t, "p1", 1, false, true)
	e.insertOutbox(t, "p2", 1, false, true)
	ctx := newBrowser(t)
	dir := artifactsDir(t)
	base := e.srv.URL

	run(t, ctx, "log in", chromedp.Navigate(base+"/login"), chromedp.WaitVisible(chromedp.CSS("#api-key")),
		chromedp.SetValue(chromedp.CSS("#api-key"), e.adminKey), chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#nav")))
	list := base + "/dead?consumer=Sync-Analytics&status=dead"
	run(t, ctx, "open a consumer's dead letters, its name mistyped", chromedp.Navigate(list), chromedp.WaitVisible(chromedp.CSS("#dead-select-all")))
	require.Contains(t, text(t, ctx, "#filter-note"), "showing sync-analytics")
	screenshot(t, ctx, dir, "lists-01-dead-1280")

	t.Run("select-all ticks the page", func(t *testing.T) {
		run(t, ctx, "tick select-all", chromedp.Click(chromedp.CSS("#dead-select-all")))
		ticked := evalAs[int](t, ctx, `document.querySelectorAll("#dead tbody input[name=id]:checked").length`)
		boxes := evalAs[int](t, ctx, `document.querySelectorAll("#dead tbody input[name=id]").length`)
		require.Equal(t, 5, boxes, "a page of 5")
		require.Equal(t, boxes, ticked)
		screenshot(t, ctx, dir, "lists-02-select-all")
	})
	t.Run("confirm() names the count and the target", func(t *testing.T) {
		asked := answerDialog(t, ctx, false)
		run(t, ctx, "discard the page, answering no", chromedp.Click(chromedp.CSS("#dead-discard-selected")))
		require.Equal(t, "Discard 5 dead letters of consumer sync-analytics? They are recorded as handled without running the handler.",
			received(t, asked))
		asked = answerDialog(t, ctx, false)
		run(t, ctx, "retry all of the filter, answering no", chromedp.Click(chromedp.CSS("#dead-retry-all")))
		require.Equal(t, "Retry all 7 dead letters matching consumer=sync-analytics, status=dead? The consumer tries them again at once.",
			received(t, asked))
		require.Equal(t, 8, e.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'dead'`), "answering no changes nothing")

		// One row, then yes: done, and the list says so.
		run(t, ctx, "clear, tick one", chromedp.Click(chromedp.CSS("#dead-select-all")),
			chromedp.Click(chromedp.CSS(fmt.Sprintf("#dead-%d input[name=id]", rows[0]))))
		asked = answerDialog(t, ctx, true)
		run(t, ctx, "retry it, answering yes", chromedp.Click(chromedp.CSS("#dead-retry-selected")),
			chromedp.WaitVisible(chromedp.CSS("#action-result")))
		require.Equal(t, "Retry 1 dead letter of consumer sync-analytics? The consumer tries them again at once.", received(t, asked))
		require.Equal(t, "1", text(t, ctx, "#action-count"))
	})
	t.Run("discard looks destructive", func(t *testing.T) {
		type buttons struct {
			Color, Background, RetryBackground string
			DiscardLeft, RetryRight            float64
		}
		style := evalAs[buttons](t, ctx, `(() => {
			const d = document.querySelector("#dead-discard-selected"), r = document.querySelector("#dead-retry-all");
			const ds = getComputedStyle(d);
			return {Color: ds.color, Background: ds.backgroundColor, RetryBackground: getComputedStyle(r).backgroundColor,
				DiscardLeft: d.getBoundingClientRect().left, RetryRight: r.getBoundingClientRect().right};
		})()`)
		require.Equal(t, "rgb(179, 38, 30)", style.Color, "red text")
		require.Equal(t, "rgb(255, 255, 255)", style.Background, "on white: outlined")
		require.Equal(t, "rgb(31, 95, 191)", style.RetryBackground, "unlike the retries")
		require.Greater(t, style.DiscardLeft-style.RetryRight, 20.0, "apart from the retries")
	})
	t.Run("errors grouped filter the list", func(t *testing.T) {
		run(t, ctx, "follow the most frequent error", chromedp.Navigate(base+"/dead?consumer=sync-analytics"),
			chromedp.WaitVisible(chromedp.CSS("#error-groups")),
			chromedp.Click(chromedp.CSS("#error-groups li:first-child a")), chromedp.WaitVisible(chromedp.CSS("#dead-error-filter")))
		require.Contains(t, text(t, ctx, "#dead-error-filter"), "ledger_amount_positive")
		require.Equal(t, "Showing 1–5 of 5", text(t, ctx, ".showing"))
		screenshot(t, ctx, dir, "lists-03-error-filter")
	})
	run(t, ctx, "the parked rows at 1280", chromedp.Navigate(base+"/parked"), chromedp.WaitVisible(chromedp.CSS("#parked")))
	screenshot(t, ctx, dir, "lists-04-parked-1280")
	t.Run("on a phone", func(t *testing.T) {
		t.Cleanup(func() { run(t, ctx, "back to the laptop", chromedp.ResetViewport()) })
		run(t, ctx, "390 px", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait))
		for _, pg := range []struct{ name, path, table string }{
			{"dead", "/dead?consumer=sync-analytics", "#dead"},
			{"parked", "/parked", "#parked"},
		} {
			run(t, ctx, "open "+pg.path, chromedp.Navigate(base+pg.path), chromedp.WaitVisible(chromedp.CSS(pg.table)))
			widths := evalAs[[]float64](t, ctx, `(() => { const t = document.querySelector("`+pg.table+`"), box = t.parentElement;
				return [document.documentElement.scrollWidth, box.scrollWidth, box.clientWidth]; })()`)
			require.LessOrEqual(t, widths[0], 390.0, "%s: the page fits", pg.path)
			require.LessOrEqual(t, widths[1], widths[2], "%s: the table fits, no sideways scroll", pg.path)
			visible := evalAs[[]bool](t, ctx, `["input[name=id]", "a.id-link", "td.error"].map(s => {
				const el = document.querySelector("`+pg.table+` tbody tr "+s); const r = el.getBoundingClientRect();
				return r.width > 0 && r.right <= window.innerWidth; })`)
			require.Equal(t, []bool{true, true, true}, visible, "%s: select box, id link and error on screen", pg.path)
			screenshot(t, ctx, dir, "lists-05-phone-390-"+pg.name)
		}
	})
}
