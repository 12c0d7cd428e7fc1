package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

// badValues are what PostgreSQL's text refuses (a NUL byte, bytes that are
// not UTF-8), alone and amid valid text.
var badValues = map[string]string{
	"NUL": "\x00", "NUL inside": "pay\x00ment", "a lone 0xff": "\xff", "a truncated sequence": "caf\xc3",
	"an overlong NUL": "\xc0\x80", "a surrogate": "\xed\xa0\x80",
}

// Every route, with any query or form parameter (its name or its value)
// holding a NUL byte or invalid UTF-8, answers 400 and never 500, logged
// in or not, whichever parameter it is (one the route reads, or not).
func TestEveryRouteRefusesNULAndInvalidUTF8(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := console.New(console.Config{Pool: e.pool})
	require.NoError(t, err)
	routes := console.Routes(c)
	require.Contains(t, routes, "GET /journey", "the list of routes is the console's")
	// The parameters each route reads, and one it does not.
	params := []string{"q", "after", "before", "done", "topic", "consumer", "status", "id", "all", "confirm",
		"aggregate_type", "aggregate_id", "api_key", "unused"}

	user := e.client(t)
	csrf := e.login(t, user)
	for _, who := range []struct {
		name   string
		client *http.Client
	}{{"logged in", user}, {"anonymous", e.client(t)}} {
		for _, rt := range routes {
			method, path, _ := strings.Cut(rt, " ")
			path = strings.TrimSuffix(path, "{$}")
			for what, bad := range badValues {
				// A logout or a login would end the session the walk goes
				// on with, if it were not refused: on another session.
				client := func() (*http.Client, string) {
					if who.client != user || (path != "/logout" && path != "/login") {
						return who.client, csrf
					}
					c := e.client(t)
					return c, e.login(t, c)
				}
				for _, p := range params {
					client, csrf := client()
					// The route's own valid form, then the bad parameter.
					form := url.Values{"csrf_token": {csrf}, "confirm": {"yes"}, "all": {"1"}, "consumer": {"analytics"},
						"aggregate_type": {"payment"}, "aggregate_id": {"p1"}}
					query := url.Values{}
					if method == http.MethodPost {
						form.Set(p, bad)
					} else {
						form = nil
						query.Set(p, bad)
					}
					u := e.srv.URL + path + "?" + query.Encode()
					res, body := do(t, client, method, u, form)
					require.Equal(t, http.StatusBadRequest, res.StatusCode, "%s %s %s: %s %s: %s", who.name, method, path, p, what, body)
				}
				// In a parameter's name, and in the query of a POST.
				name := url.Values{bad: {"1"}}.Encode()
				c, csrf := client()
				res, _ := do(t, c, method, e.srv.URL+path+"?"+name, formOf(method, csrf))
				require.Equal(t, http.StatusBadRequest, res.StatusCode, "%s %s %s: a name with %s", who.name, method, path, what)
				if method == http.MethodPost {
					c, csrf := client()
					res, _ := do(t, c, method, e.srv.URL+path, url.Values{"csrf_token": {csrf}, bad: {"1"}})
					require.Equal(t, http.StatusBadRequest, res.StatusCode, "%s %s %s: a form field's name with %s", who.name, method, path, what)
				}
			}
		}
	}
	require.Zero(t, e.count(t, `SELECT count(*) FROM outflow_operator_actions`), "nothing done")

	res, _ := do(t, user, http.MethodPost, e.srv.URL+"/parked/retry",
		url.Values{"csrf_token": {csrf}, "topic": {strings.Repeat("t", 1<<20)}, "all": {"1"}, "confirm": {"yes"}})
	require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode, "a form over 1 MiB")
}

func formOf(method, csrf string) url.Values {
	if method != http.MethodPost {
		return nil
	}
	return url.Values{"csrf_token": {csrf}}
}
