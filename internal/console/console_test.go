package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/apikey"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/outflowtest"
)

// env is a console on a fresh schema of both migration sets, behind a
// real HTTP server, with an admin key.
type env struct {
	pool     *pgxpool.Pool
	srv      *httptest.Server
	adminKey string
	adminID  string
	console  *console.Console
	// served counts the requests the console has finished: a test whose
	// client gave up waits on it for the handler's end.
	served *atomic.Int64
	// hookEP is insertDelivery's endpoint, made on first use.
	hookEP string
}

var consumers = []console.Consumer{{Name: "notify-merchant", Topic: "payments"}, {Name: "analytics", Topic: "payments"}}

// stalls is the mutator of the tests about a stalled database: they
// lock a table and wait for the console's default ReadTimeout to pass
// (newEnv's is loadedReadTimeout, so that a loaded machine's slow read
// is not taken for a stall).
func stalls(c *console.Config) { c.ReadTimeout = console.DefaultReadTimeout }

func newEnv(t *testing.T, mut ...func(*console.Config)) *env {
	t.Helper()
	return newEnvWith(t, nil, mut...)
}

// newEnvWith is newEnv with before applied to the console before it
// serves (a clock).
func newEnvWith(t *testing.T, before func(*console.Console), mut ...func(*console.Config)) *env {
	t.Helper()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	cfg := console.Config{Pool: s.Pool, InsecureCookie: true, Consumers: consumers, PageSize: 2, ReadTimeout: loadedReadTimeout}
	for _, m := range mut {
		m(&cfg)
	}
	c, err := console.New(cfg)
	require.NoError(t, err)
	if before != nil {
		before(c)
	}
	served := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer served.Add(1)
		c.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	k, err := apikey.Create(context.Background(), s.Pool, apikey.New{Name: "ops"})
	require.NoError(t, err)
	return &env{pool: s.Pool, srv: srv, adminKey: k.Secret, adminID: k.ID, console: c, served: served}
}

// client is a browser: a cookie jar, and redirects not followed, so that
// tests see them.
func (e *env) client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, method, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	res, err := c.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

var csrfRe = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// login logs c in and returns the CSRF token of its session.
func (e *env) login(t *testing.T, c *http.Client) string {
	t.Helper()
	res, _ := do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {e.adminKey}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/", res.Header.Get("Location"))
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m, "the page carries the CSRF token")
	return m[1]
}

func (e *env) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

func (e *env) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), q, args...)
	require.NoError(t, err)
}

// insertOutbox adds an outbox row and returns its id. A published row
// moves the partitions' cursors to it (every row below it reads published
// too, but for those in outbox_failures: insert the pending ones after);
// a parked one is parked in outbox_failures.
func (e *env) insertOutbox(t *testing.T, aggID string, version int, published, parked bool) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	require.NoError(t, e.pool.QueryRow(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 'payments', 'payment', $1, $2, 'payment.paid', '{"amount":100}', now())
		RETURNING id`, aggID, version).Scan(&id))
	if published {
		require.NoError(t, outflowtest.PublishThrough(ctx, e.pool, id))
	}
	if parked {
		require.NoError(t, outflowtest.ParkRow(ctx, e.pool, id, 10, "broker said no"))
	}
	return id
}

func (e *env) messageID(t *testing.T, outboxID int64) string {
	t.Helper()
	var mid string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT message_id::text FROM outbox WHERE id = $1`, outboxID).Scan(&mid))
	return mid
}

func (e *env) sessions(t *testing.T) int { return e.count(t, `SELECT count(*) FROM console_sessions`) }

// A wrong key, and a merchant's key (not an admin's), get the login page
// again with a 401, and no cookie nor session.
func TestLoginRefusesWrongAndMerchantKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `INSERT INTO merchants (id, name, webhook_url, webhook_secret) VALUES ('00000000-0000-0000-0000-00000000000a', 'm', 'https://example.com', 's')`)
	merchantKey, err := apikey.Create(ctx, e.pool, apikey.New{MerchantID: "00000000-0000-0000-0000-00000000000a"})
	require.NoError(t, err)
	revoked, err := apikey.Create(ctx, e.pool, apikey.New{Name: "old admin"})
	require.NoError(t, err)
	_, err = apikey.Revoke(ctx, e.pool, revoked.ID)
	require.NoError(t, err)

	for name, key := range map[string]string{
		"wrong": "ofk_nope", "empty": "", "merchant": merchantKey.Secret, "revoked admin": revoked.Secret,
	} {
		c := e.client(t)
		res, body := do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {key}})
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, name)
		require.Empty(t, res.Header.Values("Set-Cookie"), name)
		require.Contains(t, body, `id="login-error"`, name)
		if key != "" {
			require.NotContains(t, body, key, "%s: the key is not echoed", name)
		}
		require.Equal(t, 0, e.sessions(t), name)
		res, _ = do(t, c, http.MethodGet, e.srv.URL+"/", nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, name)
	}
}

// The admin key opens a session: an HttpOnly, SameSite=Strict cookie whose
// token is stored only hashed; logout ends it.
func TestLoginSessionAndLogout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	res, _ := do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "no session: to the login page")
	require.Equal(t, "/login", res.Header.Get("Location"))

	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {e.adminKey}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	cookies := res.Cookies()
	require.Len(t, cookies, 1)
	ck := cookies[0]
	require.Equal(t, console.CookieName, ck.Name)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.False(t, ck.Secure, "InsecureCookie: plain HTTP on loopback")
	require.Equal(t, 8*3600, ck.MaxAge)
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM console_sessions WHERE token_hash = convert_to($1, 'UTF8')`, ck.Value),
		"the token is not stored as it is")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM console_sessions WHERE token_hash = sha256(convert_to($1, 'UTF8'))
		AND expires_at BETWEEN now() + interval '7 hours 59 minutes' AND now() + interval '8 hours'`, ck.Value))

	csrf := e.login(t, c)
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/logout", url.Values{"csrf_token": {csrf}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, 1, e.sessions(t), "the other login's session is left")
	res, _ = do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "logged out")
}

// Revoking the key ends its sessions at once.
func TestRevokedKeyEndsSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	e.login(t, c)
	_, err := apikey.Revoke(context.Background(), e.pool, e.adminID)
	require.NoError(t, err)
	res, _ := do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
}

// A POST without the session's CSRF token, or with another, is a 403 and
// changes nothing; with it, the action runs and is recorded.
func TestCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.insertOutbox(t, "p1", 1, false, true)
	c := e.client(t)
	csrf := e.login(t, c)
	other := e.client(t)
	otherCSRF := e.login(t, other)
	require.NotEqual(t, csrf, otherCSRF)

	for name, token := range map[string][]string{"missing": nil, "empty": {""}, "another session's": {otherCSRF}} {
		form := url.Values{"id": {strconv.FormatInt(id, 10)}, "confirm": {"yes"}}
		if token != nil {
			form["csrf_token"] = token
		}
		res, _ := do(t, c, http.MethodPost, e.srv.URL+"/parked/retry", form)
		require.Equal(t, http.StatusForbidden, res.StatusCode, name)
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_failures WHERE id = $1 AND parked_at IS NOT NULL`, id), name)
		require.Equal(t, 0, e.count(t, `SELECT count(*) FROM outflow_operator_actions`), name)
	}
	res, _ := do(t, c, http.MethodPost, e.srv.URL+"/logout", url.Values{})
	require.Equal(t, http.StatusForbidden, res.StatusCode, "logout too")
	require.Equal(t, 2, e.sessions(t))
}

// An expired session is no session; without one, pages redirect to the
// login page and a POST is refused, changing nothing.
func TestExpiredAndMissingSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.insertOutbox(t, "p1", 1, false, true)
	anon := e.client(t)
	// To the login, which returns to the page asked for (but the
	// overview, where it goes anyway, and a script's fragment).
	for path, login := range map[string]string{"/": "/login", "/fragments/overview": "/login",
		"/journey?q=x": "/login?next=%2Fjourney%3Fq%3Dx", "/parked": "/login?next=%2Fparked", "/dead": "/login?next=%2Fdead",
		"/actions": "/login?next=%2Factions", "/search?event_type=payment.paid": "/login?next=%2Fsearch%3Fevent_type%3Dpayment.paid"} {
		res, _ := do(t, anon, http.MethodGet, e.srv.URL+path, nil)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, path)
		require.Equal(t, login, res.Header.Get("Location"), path)
	}
	res, _ := do(t, anon, http.MethodPost, e.srv.URL+"/parked/retry", url.Values{"id": {strconv.FormatInt(id, 10)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)

	c := e.client(t)
	csrf := e.login(t, c)
	e.exec(t, `UPDATE console_sessions SET expires_at = now() - interval '1 second'`)
	res, _ = do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "expired")
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/parked/retry", url.Values{"csrf_token": {csrf}, "id": {strconv.FormatInt(id, 10)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, "expired")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_failures WHERE parked_at IS NOT NULL`))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM outflow_operator_actions`))
}

// The static assets are embedded and served without a session.
func TestStaticAssets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for path, ctype := range map[string]string{"/static/console.css": "text/css", "/static/console.js": "text/javascript"} {
		res, body := do(t, e.client(t), http.MethodGet, e.srv.URL+path, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.Contains(t, res.Header.Get("Content-Type"), ctype, path)
		require.NotEmpty(t, body)
	}
	res, _ := do(t, e.client(t), http.MethodGet, e.srv.URL+"/login", nil)
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "default-src 'self'")
	require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
}

// /static/ serves files, never a listing of a directory: the directory
// itself, spelled any way, is a 404, logged in or not.
func TestStaticListsNoDirectory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	user := e.client(t)
	e.login(t, user)
	for _, c := range []*http.Client{e.client(t), user} {
		for _, path := range []string{"/static/", "/static/.", "/static/./", "/static//", "/static/?C=M&O=A", "/static/%2e/"} {
			res, body := do(t, c, http.MethodGet, e.srv.URL+path, nil)
			require.NotContains(t, body, "console.css", path)
			if res.StatusCode != http.StatusNotFound {
				require.Contains(t, []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect}, res.StatusCode, "%s: %s", path, body)
				// A redirect to the clean path, which is a 404 in turn.
				loc := res.Header.Get("Location")
				res, body = do(t, c, http.MethodGet, e.srv.URL+loc, nil)
				require.Equal(t, http.StatusNotFound, res.StatusCode, "%s -> %s", path, loc)
				require.NotContains(t, body, "console.css", path)
			}
		}
		res, body := do(t, c, http.MethodGet, e.srv.URL+"/static/console.css", nil)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.NotEmpty(t, body)
	}
}

// lockTable holds an ACCESS EXCLUSIVE lock on table, from a connection of
// its own, until t ends: every read of the table waits behind it.
func (e *env) lockTable(t *testing.T, table string) {
	t.Helper()
	ctx := context.Background()
	locker, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(ctx) })
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{table}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
}
