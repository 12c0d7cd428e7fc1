package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/apikey"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/outflowtest"
)

// firstOverview logs a new client in to srv and returns the first
// overview it is shown: the page the login lands on.
func firstOverview(t *testing.T, e *env) string {
	t.Helper()
	c := e.client(t)
	res, _ := do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {e.adminKey}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	return body
}

// With Run sampling the published total, the first overview after start
// shows the rate over the window: what the forwarders published since
// Run's first sample, per second. A console whose Run is not running shows
// n/a, as it did before Run existed: it has only that read.
func TestRunGivesTheFirstOverviewARate(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	ctx := context.Background()
	key, err := apikey.Create(ctx, s.Pool, apikey.New{Name: "ops"})
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `INSERT INTO outbox_partitions (partition, published_total) VALUES (0, 100), (1, 20)`)
	require.NoError(t, err)

	// A clock the test moves: the rate's interval is then exact.
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var offset atomic.Int64
	clock := func() time.Time { return t0.Add(time.Duration(offset.Load())) }

	newConsole := func() (*console.Console, *env) {
		c, err := console.New(console.Config{Pool: s.Pool, InsecureCookie: true, Logger: quiet,
			RateSampleInterval: 10 * time.Millisecond, RateWindow: time.Minute})
		require.NoError(t, err)
		console.SetClock(c, clock)
		srv := httptest.NewServer(c)
		t.Cleanup(srv.Close)
		return c, &env{pool: s.Pool, srv: srv, adminKey: key.Secret, adminID: key.ID}
	}
	sampled, e := newConsole()
	_, unsampled := newConsole()

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sampled.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	outflowtest.WaitFor(t, 10*time.Second, "Run's first sample", func() bool { return console.RateSamples(sampled) > 0 })

	// 20 seconds on, the forwarders have published 90 events (as they do:
	// each adds to its partition's total).
	offset.Store(int64(20 * time.Second))
	_, err = s.Pool.Exec(ctx, `UPDATE outbox_partitions SET published_total = published_total + 45`)
	require.NoError(t, err)

	body := firstOverview(t, e)
	requireText(t, body, "outbox-published-total", "210")
	requireText(t, body, "outbox-rate", "4.5/s") // 90 over 20 s
	requireText(t, firstOverview(t, unsampled), "outbox-rate", "n/a")

	stop()
	select {
	case err := <-done:
		require.NoError(t, err, "Run ends with its context")
		done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end with its context")
	}
}
