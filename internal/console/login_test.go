package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/internal/console"
)

// testClock is a clock the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClockEnv(t *testing.T) (*env, *testClock) {
	clock := &testClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	return newEnvWith(t, func(c *console.Console) { console.SetClock(c, clock.Now) }), clock
}

// retryAfterSecs is a 429's Retry-After, checked to be within [lo, hi]
// seconds.
func retryAfterSecs(t *testing.T, res *http.Response, lo, hi int) time.Duration {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	s, err := strconv.Atoi(res.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After: %q", res.Header.Get("Retry-After"))
	require.GreaterOrEqual(t, s, lo)
	require.LessOrEqual(t, s, hi)
	return time.Duration(s) * time.Second
}

// Failed logins from one address: five cost nothing, then each refuses
// that address's logins (the right key's too, without a session) for a
// delay that doubles; a successful login starts the count afresh.
func TestFailedLoginsAreThrottledPerAddress(t *testing.T) {
	t.Parallel()
	e, clock := newClockEnv(t)
	c := e.client(t)
	login := func(key string) (*http.Response, string) {
		return do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {key}})
	}
	failFive := func() {
		for i := range 5 {
			res, _ := login("nope")
			require.Equal(t, http.StatusUnauthorized, res.StatusCode, "failure %d", i+1)
		}
	}
	failFive()
	res, body := login("nope")
	wait := retryAfterSecs(t, res, 1, 2) // 2 s, jittered into its upper half
	require.Contains(t, body, `id="login-error"`)
	res, _ = login(e.adminKey)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the right key too, while refused")
	require.Empty(t, res.Header.Values("Set-Cookie"))
	require.Zero(t, e.sessions(t))

	// Each failure once the delay is over doubles it.
	for _, bounds := range [][2]int{{2, 4}, {4, 8}, {8, 16}} {
		clock.Advance(wait)
		res, _ = login("nope")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "tried once the delay is over")
		res, _ = login("nope")
		wait = retryAfterSecs(t, res, bounds[0], bounds[1])
	}

	clock.Advance(wait)
	res, _ = login(e.adminKey)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "logged in once the delay is over")
	failFive() // the count starts afresh
	res, _ = login("nope")
	retryAfterSecs(t, res, 1, 2)
}

// Failed logins with secrets that claim one key (its prefix) are throttled
// whatever address they come from; another key, from another address, is
// not.
func TestFailedLoginsAreThrottledPerKey(t *testing.T) {
	t.Parallel()
	e, clock := newClockEnv(t)
	other, err := apikey.Create(t.Context(), e.pool, apikey.New{Name: "other"})
	require.NoError(t, err)
	prefix := apikey.PrefixOf(e.adminKey)
	require.NotEmpty(t, prefix)
	from := 0
	login := func(key string) *httptest.ResponseRecorder {
		from++ // a new address each time: only the key is the same
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"api_key": {key}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = "127.0.0." + strconv.Itoa(from) + ":40000"
		rec := httptest.NewRecorder()
		e.console.ServeHTTP(rec, req)
		return rec
	}
	for i := range 5 {
		require.Equal(t, http.StatusUnauthorized, login(prefix+"guess"+strconv.Itoa(i)).Code, "guess %d", i)
	}
	rec := login(prefix + "guess5")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.NotEmpty(t, rec.Header().Get("Retry-After"))
	require.Equal(t, http.StatusTooManyRequests, login(e.adminKey).Code, "the key itself, while its prefix is refused")
	require.Equal(t, http.StatusSeeOther, login(other.Secret).Code, "another key")

	clock.Advance(time.Minute) // past the 1-2 s of a fifth failure (refused logins add none)
	require.Equal(t, http.StatusSeeOther, login(e.adminKey).Code, "the delay over")
	for i := range 5 {
		require.Equal(t, http.StatusUnauthorized, login(prefix+"again"+strconv.Itoa(i)).Code, "the count started afresh: %d", i)
	}
}

// Logging out is recorded in the audit trail, with the session it ended,
// and listed on /actions.
func TestLogoutIsRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	csrf := e.login(t, c)
	res, _ := do(t, c, http.MethodPost, e.srv.URL+"/logout", url.Values{"csrf_token": {csrf}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Zero(t, e.sessions(t))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'logout' AND actor_id = $1
		AND actor_name = 'ops' AND result_count = 1 AND error = '' AND at > now() - interval '1 minute'`, e.adminID))

	e.login(t, c)
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/actions", nil)
	require.Regexp(t, `(?s)<tr class="action".*?logout`, body)
}

// A page asked for without a session sends to the login with next= the
// page (path and query); the login form carries it, and a login goes
// there. A refused login keeps it for the next try.
func TestLoginReturnsToTheAskedPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	asked := "/search?topic=payments&from=2026-03-01+12:00"
	res, _ := do(t, c, http.MethodGet, e.srv.URL+asked, nil)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	loc := res.Header.Get("Location")
	require.Equal(t, "/login?next="+url.QueryEscape(asked), loc)
	res, body := do(t, c, http.MethodGet, e.srv.URL+loc, nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `<input type="hidden" name="next" id="login-next" value="/search?topic=payments&amp;from=2026-03-01&#43;12:00">`)

	res, body = do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {"ofk_wrong"}, "next": {asked}})
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	require.Contains(t, body, `id="login-next"`, "a refused login keeps where to return")
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {e.adminKey}, "next": {asked}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, asked, res.Header.Get("Location"))
	res, _ = do(t, c, http.MethodGet, e.srv.URL+asked, nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
}

// Only a path of the console is returned to: anything a browser could
// read as another site (an open redirect) goes to the overview, and the
// login page does not offer it.
func TestLoginRefusesAForeignNext(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, next := range []string{
		"https://evil.example/", "http://evil.example", "//evil.example", "//evil.example/search", "///evil.example",
		`/\evil.example`, `\\evil.example`, `/\/evil.example`, "\\/evil.example", "javascript:alert(1)", "evil.example",
		"/\t/evil.example", "/\n/evil.example", "/\r\n/evil.example", " //evil.example", "/ /evil.example",
		"https:evil.example", "//user@evil.example", "/login", "/login?next=//evil.example", "", "search",
		"/" + strings.Repeat("a", 3000),
	} {
		c := e.client(t)
		res, body := do(t, c, http.MethodGet, e.srv.URL+"/login?next="+url.QueryEscape(next), nil)
		require.Equal(t, http.StatusOK, res.StatusCode, "%q", next)
		require.NotContains(t, body, `id="login-next"`, "%q", next)
		res, _ = do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {e.adminKey}, "next": {next}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "%q", next)
		require.Equal(t, "/", res.Header.Get("Location"), "%q", next)
	}
	// Local paths, however they look, are kept: a path is a path.
	for _, next := range []string{"/dead?consumer=analytics&after=41#dead-42", "/journey?q=%2F%2Fevil.example", "/parked"} {
		c := e.client(t)
		res, _ := do(t, c, http.MethodPost, e.srv.URL+"/login", url.Values{"api_key": {e.adminKey}, "next": {next}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "%q", next)
		require.Equal(t, next, res.Header.Get("Location"), "%q", next)
	}
}
