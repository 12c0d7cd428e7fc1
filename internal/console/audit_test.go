package console_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/actionlog"
)

// The Actions page's filter and pager refuse what names nothing, with a
// 400 naming the parameter: a filter never silently matches nothing.
func TestActionsPageRefusesABadFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	e.login(t, c)
	for query, want := range map[string]string{
		"?kind=robot":          "kind must be empty, console or cli",
		"?action=dlq.explode":  `action "dlq.explode": no such action recorded`,
		"?before=5&after=3":    "before and after",
		"?kind=cli&action=nop": "no such action recorded",
	} {
		res, body := do(t, c, http.MethodGet, e.srv.URL+"/actions"+query, nil)
		require.Equal(t, http.StatusBadRequest, res.StatusCode, query)
		require.Contains(t, body, want, query)
	}
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/actions?kind=cli", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "No action matches the filter.")
}

// The pager's links keep the filter: Older, then Newer and First, list
// only what it matches, with its total.
func TestActionsPagerKeepsTheFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2
	cli := actionlog.Actor{Kind: actionlog.CLI, ID: "ops@bastion", Name: "ops"}
	for _, a := range []string{"replay", "dlq.retry", "replay", "replay", "dlq.retry", "replay"} {
		_, err := actionlog.Insert(context.Background(), e.pool, actionlog.Entry{Actor: cli, Action: a, Target: struct{}{}})
		require.NoError(t, err)
	}
	c := e.client(t)
	e.login(t, c)
	link := func(body, class string) string {
		t.Helper()
		m := regexp.MustCompile(`class="` + class + `" href="([^"]+)"`).FindStringSubmatch(body)
		require.NotNil(t, m, "%s in %s", class, body)
		return e.srv.URL + strings.ReplaceAll(m[1], "&amp;", "&")
	}
	page := func(u string) string {
		t.Helper()
		res, body := do(t, c, http.MethodGet, u, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "4 action(s) matching the filter", u)
		require.NotContains(t, body, `data-action="dlq.retry"`, u)
		return body
	}
	// The rows, without the ages beside their times ("1 s ago" becomes "2 s ago" between two reads).
	rows := func(body string) string {
		return agoRe.ReplaceAllString(body[strings.Index(body, "<tbody>"):strings.Index(body, "</tbody>")], "")
	}
	first := page(e.srv.URL + "/actions?kind=cli&action=replay")
	require.Equal(t, 2, strings.Count(first, `<tr class="action"`))
	require.NotContains(t, first, "first-page")
	older := page(link(first, "next-page"))
	require.Equal(t, 2, strings.Count(older, `<tr class="action"`))
	require.NotContains(t, older, "next-page", "the last page")
	require.Equal(t, rows(first), rows(page(link(older, "prev-page"))), "Newer leads back to the first page's rows")
	require.Equal(t, rows(first), rows(page(link(older, "first-page"))))
}

// agoRe is a time's relative age, as the pages write it beside the time.
var agoRe = regexp.MustCompile(`<span class="ago">\([^)]*\)</span>`)
