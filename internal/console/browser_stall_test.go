package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
)

// In a browser, while the database stalls: a panel whose table is locked
// reads "Unavailable" and the rest of the overview stays live; when the
// console cannot refresh at all (its session lookup is locked out), the
// page says its numbers are stale and how old, instead of showing them as
// current; and the live refresh never has two requests out at once.
func TestConsoleInBrowserWhileTheDatabaseStalls(t *testing.T) {
	t.Parallel() // beside the other browser tests: each has its own tab of the shared Chromium, database and servers
	e := newEnv(t, stalls)
	var inFlight, maxInFlight, fragments atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/fragments/") {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			defer fragments.Add(1)
			for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
			}
		}
		e.console.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ctx := newBrowser(t)
	dir := artifactsDir(t)
	bg := context.Background()

	run(t, ctx, "log in", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#api-key")),
		chromedp.SetValue(chromedp.CSS("#api-key"), e.adminKey), chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#overview")))

	lock := func(table string) pgx.Tx {
		conn, err := pgx.ConnectConfig(bg, e.pool.Config().ConnConfig.Copy())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(bg) })
		tx, err := conn.Begin(bg)
		require.NoError(t, err)
		_, err = tx.Exec(bg, `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		return tx
	}

	// One panel's table locked: that panel says so, the others stay.
	tx := lock("outbox_forwarders")
	run(t, ctx, "the partitions panel unavailable after a refresh", chromedp.WaitVisible(chromedp.CSS("#partitions-unavailable")))
	require.Contains(t, text(t, ctx, "#partitions-unavailable"), "the database did not answer within 700ms")
	run(t, ctx, "the outbox panel still shown", chromedp.WaitVisible(chromedp.CSS("#outbox-pending")))
	screenshot(t, ctx, dir, "01-panel-unavailable")
	require.NoError(t, tx.Rollback(bg))
	run(t, ctx, "the partitions panel back", chromedp.WaitVisible(chromedp.CSS("#partitions-fold")))

	// The session lookup locked out: the fragment cannot answer, and the
	// page says its numbers are stale.
	tx = lock("console_sessions")
	run(t, ctx, "the overview marked stale", chromedp.WaitVisible(chromedp.CSS("#overview-at.stale")))
	require.Contains(t, text(t, ctx, "#overview-at"), "Stale: these numbers are")
	screenshot(t, ctx, dir, "02-stale")
	// Refreshes keep trying, one at a time, while the lock lasts.
	tried := fragments.Load()
	outflowtest.WaitFor(t, 20*time.Second, "two more refreshes tried under the lock", func() bool {
		return fragments.Load() >= tried+2
	})
	require.NoError(t, tx.Rollback(bg))
	run(t, ctx, "fresh again once the database answers", chromedp.WaitVisible(chromedp.CSS("#overview-at:not(.stale)")))
	require.Contains(t, text(t, ctx, "#overview-at"), "As of")
	require.EqualValues(t, 1, maxInFlight.Load(), "the live refresh never had two requests out at once")
}
