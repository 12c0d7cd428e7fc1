package console_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
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
