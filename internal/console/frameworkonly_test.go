package console_test

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// A service of a user's own: the framework's tables and its refunds set,
// nothing of the reference app.
func userSchema(t *testing.T) *outflowtest.Schema {
	t.Helper()
	return outflowtest.NewSchema(t, migrations.Set{Name: "refunds", FS: os.DirFS("../../migrations/testdata/refunds"),
		VersionTable: "refunds_schema_migrations"})
}

// On a database without the reference app's tables, a FrameworkOnly
// console logs the operator key in (no other), serves every framework
// page without a 500, shows the app's parts as not installed, acts on
// parked rows, logs out, and creates no table.
func TestFrameworkOnlyConsole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := userSchema(t)
	const key = "operator-key-of-the-refunds-service-0123456789"
	sum := sha256.Sum256([]byte(key))
	c, err := console.New(console.Config{Pool: s.Pool, InsecureCookie: true, FrameworkOnly: true, OperatorKeySHA256: sum[:],
		Consumers: []console.Consumer{{Name: "refunds-projection", Topic: "refunds"}}, AggregateType: "refund"})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	before := tableCount(t, s)

	_, err = s.Pool.Exec(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 'refunds', 'refund', 'r1', 1, 'refund.requested', '{}', now());
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata, status, reason)
		VALUES ('refunds-projection', gen_random_uuid(), 'refund.requested', 'refund', 'r1', 1, '', '{}', 'dead', 'handler failed')`)
	require.NoError(t, err)
	var id int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&id))
	require.NoError(t, outflowtest.ParkRow(ctx, s.Pool, id, 10, "broker said no"))

	e := &env{srv: srv}
	cl := e.client(t)
	res, body := do(t, cl, http.MethodGet, srv.URL+"/", nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "a page needs a session")
	res, body = do(t, cl, http.MethodPost, srv.URL+"/login", url.Values{"api_key": {"not-the-key"}})
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, body)
	res, body = do(t, cl, http.MethodPost, srv.URL+"/login", url.Values{"api_key": {""}})
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, body)

	e.adminKey = key
	csrf := e.login(t, cl)
	for page, want := range map[string]string{
		"/":                    "webhooks-not-installed",
		"/fragments/overview":  "refunds-projection",
		"/journey?q=r1":        "refund.requested",
		"/parked":              "broker said no",
		"/dead":                "handler failed",
		"/dead?status=dead":    "handler failed",
		"/actions":             "actions-total",
		"/webhooks":            "webhooks-not-installed",
		"/parked?topic=refund": "",
	} {
		res, body := do(t, cl, http.MethodGet, srv.URL+page, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", page, body)
		require.Contains(t, body, want, page)
	}

	res, body = do(t, cl, http.MethodPost, srv.URL+"/parked/retry",
		url.Values{"csrf_token": {csrf}, "id": {strconv.FormatInt(id, 10)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	var parked int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_failures WHERE parked_at IS NOT NULL`).Scan(&parked))
	require.Zero(t, parked, "retried")
	// Recorded in the framework's audit, as an API key's would be: the
	// page returned to shows it, and so does the Actions page.
	var recorded int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outflow_operator_actions WHERE actor_kind = 'console'
		AND actor_id = 'operator-key' AND actor_name = 'operator' AND action = 'outbox.retry' AND result_count = 1
		AND target = jsonb_build_object('ids', jsonb_build_array($1::bigint))`, id).Scan(&recorded))
	require.Equal(t, 1, recorded)
	res, body = do(t, cl, http.MethodGet, srv.URL+res.Header.Get("Location"), nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	requireText(t, body, "action-count", "1")
	res, body = do(t, cl, http.MethodGet, srv.URL+"/actions", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `data-action="outbox.retry"`)

	res, body = do(t, cl, http.MethodPost, srv.URL+"/parked/retry", url.Values{"id": {"1"}, "confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token: %s", body)

	res, _ = do(t, cl, http.MethodPost, srv.URL+"/logout", url.Values{"csrf_token": {csrf}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	res, _ = do(t, cl, http.MethodGet, srv.URL+"/", nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "logged out")

	require.Equal(t, before, tableCount(t, s), "no table created")
	var app bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT to_regclass('api_keys') IS NOT NULL OR to_regclass('console_sessions') IS NOT NULL
		OR to_regclass('webhook_deliveries') IS NOT NULL OR to_regclass('app_schema_migrations') IS NOT NULL`).Scan(&app))
	require.False(t, app, "nothing of the reference app")
}

func tableCount(t *testing.T, s *outflowtest.Schema) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, s.Name).Scan(&n))
	return n
}

// FrameworkOnly needs the operator key's hash, and the hash is refused
// without FrameworkOnly (the app's API keys log in there).
func TestFrameworkOnlyConfig(t *testing.T) {
	t.Parallel()
	s := userSchema(t)
	sum := sha256.Sum256([]byte("k"))
	for name, cfg := range map[string]console.Config{
		"no key":         {Pool: s.Pool, FrameworkOnly: true},
		"short key hash": {Pool: s.Pool, FrameworkOnly: true, OperatorKeySHA256: sum[:16]},
		"key without it": {Pool: s.Pool, OperatorKeySHA256: sum[:]},
	} {
		_, err := console.New(cfg)
		require.ErrorIs(t, err, console.ErrInvalidConfig, name)
	}
}

// A FrameworkOnly console's logout ends its in-memory session whatever the
// database does: here its pool is closed by then, and the session's
// cookie, replayed, is refused all the same (no page read follows).
func TestFrameworkOnlyLogoutWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := userSchema(t)
	pool, err := pgxpool.New(ctx, s.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const key = "operator-key-of-the-refunds-service-0123456789"
	sum := sha256.Sum256([]byte(key))
	c, err := console.New(console.Config{Pool: pool, InsecureCookie: true, FrameworkOnly: true, OperatorKeySHA256: sum[:]})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	e := &env{srv: srv, adminKey: key}
	cl := e.client(t)
	csrf := e.login(t, cl)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	cookies := cl.Jar.Cookies(u)
	require.NotEmpty(t, cookies)

	pool.Close() // BEGIN, or any query, fails from now on
	res, body := do(t, cl, http.MethodPost, srv.URL+"/logout", url.Values{"csrf_token": {csrf}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.Equal(t, "/login", res.Header.Get("Location"))

	replay := e.client(t)
	replay.Jar.SetCookies(u, cookies)
	res, body = do(t, replay, http.MethodGet, srv.URL+"/", nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "the session is over: %s", body)
	require.Equal(t, "/login", res.Header.Get("Location"))
}
