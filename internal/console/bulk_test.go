package console_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

var hiddenRe = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// listForm is what a list page's action form sends for "all (filter)":
// its hidden fields, all=1, and whether the page offers the button.
func listForm(t *testing.T, body, formID, button string) (url.Values, bool) {
	t.Helper()
	m := regexp.MustCompile(`(?s)<form method="post"[^>]* id="` + formID + `".*?</form>`).FindString(body)
	require.NotEmpty(t, m, "no form #%s", formID)
	form := url.Values{}
	for _, h := range hiddenRe.FindAllStringSubmatch(m, -1) {
		form.Add(html.UnescapeString(h[1]), html.UnescapeString(h[2]))
	}
	form.Set("all", "1")
	form.Set("confirm", "yes")
	return form, regexp.MustCompile(`id="` + button + `"`).MatchString(m)
}

// "Retry all / Discard all (filter)" acts on exactly the rows its list
// shows under that filter (consumer and status, or topic; every page of
// it), and its record names that filter, nothing else, and the count. A
// dead letters' filter that shows none that can be retried or discarded
// (held, retrying) offers no such button, and a request for one anyway is
// a 400 that changes nothing.
func TestBulkActionsActOnWhatTheFilterShows(t *testing.T) {
	t.Parallel()
	type want struct {
		status int
		target string // the record's target, as jsonb text
	}
	for _, tc := range []struct {
		name, list, button, path string
		// extra are fields the action does not use: not recorded.
		extra url.Values
		want
	}{
		{"retry dead of a consumer", "/dead?consumer=analytics&status=dead", "dead-retry-all", "/dead/retry", url.Values{"topic": {"refunds"}},
			want{http.StatusSeeOther, `{"all": true, "status": "dead", "consumer": "analytics"}`}},
		{"discard dead of a consumer, any open status", "/dead?consumer=analytics", "dead-discard-all", "/dead/discard", nil,
			want{http.StatusSeeOther, `{"all": true, "consumer": "analytics"}`}},
		{"retry dead of every consumer", "/dead?status=dead", "dead-retry-all", "/dead/retry", nil,
			want{http.StatusSeeOther, `{"all": true, "status": "dead"}`}},
		{"retry held", "/dead?consumer=analytics&status=held", "dead-retry-all", "/dead/retry", nil, want{status: http.StatusBadRequest}},
		{"discard retrying", "/dead?status=retrying", "dead-discard-all", "/dead/discard", nil, want{status: http.StatusBadRequest}},
		{"retry parked of a topic", "/parked?topic=refunds", "parked-retry-all", "/parked/retry", nil,
			want{http.StatusSeeOther, `{"all": true, "topic": "refunds"}`}},
		{"discard every parked row", "/parked", "parked-discard-all", "/parked/discard",
			url.Values{"consumer": {"analytics"}, "status": {"dead"}, "id": {"1"}},
			want{http.StatusSeeOther, `{"all": true}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *console.Config) { c.PageSize = 1000 })
			for i, r := range []struct{ consumer, status string }{
				{"analytics", "dead"}, {"analytics", "held"}, {"analytics", "retrying"}, {"analytics", "dead"},
				{"notify-merchant", "dead"}, {"notify-merchant", "held"}, {"analytics", "resolved"},
			} {
				e.insertDead(t, r.consumer, fmt.Sprintf("00000000-0000-0000-0000-%012d", i+1), "agg-"+strconv.Itoa(i), 1, r.status)
			}
			for i, topic := range []string{"payments", "refunds", "refunds", "payments"} {
				id := e.insertOutbox(t, "agg-"+strconv.Itoa(i), 1, false, true)
				e.exec(t, `UPDATE outbox SET topic = $2 WHERE id = $1`, id, topic)
			}
			e.insertOutbox(t, "pending", 1, false, false)
			c := e.client(t)
			csrf := e.login(t, c)

			res, body := do(t, c, http.MethodGet, e.srv.URL+tc.list, nil)
			require.Equal(t, http.StatusOK, res.StatusCode)
			dead := tc.path == "/dead/retry" || tc.path == "/dead/discard"
			rowRe := regexp.MustCompile(`<tr class="parked-row[^"]*" id="parked-(\d+)"`)
			formID := "parked-form"
			if dead {
				rowRe, formID = regexp.MustCompile(`<tr class="dead-row" id="dead-(\d+)" data-message-id="[^"]*" data-status="([^"]*)"`), "dead-form"
			}
			// What the page shows that the action can act on: dead letters
			// whose status is dead; every parked row.
			var shown []string
			for _, m := range rowRe.FindAllStringSubmatch(body, -1) {
				if !dead {
					shown = append(shown, "outbox:"+m[1])
				} else if m[2] == "dead" {
					shown = append(shown, "dead:"+m[1])
				}
			}
			slices.Sort(shown)
			form, offered := listForm(t, body, formID, tc.button)
			require.Equal(t, csrf, form.Get("csrf_token"))
			require.Equal(t, tc.status != http.StatusBadRequest, offered, "the page offers the button")
			for k, v := range tc.extra {
				form[k] = v
			}
			before := e.actedOn(t)

			res, body = do(t, c, http.MethodPost, e.srv.URL+tc.path, form)
			require.Equal(t, tc.status, res.StatusCode, body)
			changed := e.actedOn(t)
			var acted []string
			for id, state := range changed {
				if before[id] != state {
					acted = append(acted, id)
				}
			}
			slices.Sort(acted)
			if tc.status == http.StatusBadRequest {
				require.Empty(t, acted, "nothing changed")
				require.Zero(t, e.count(t, `SELECT count(*) FROM outflow_operator_actions`), "nothing recorded")
				return
			}
			require.NotEmpty(t, shown)
			require.Equal(t, shown, acted, "the action changed exactly what the list shows")
			// The record names the filter, the count and the bound of
			// "all": the newest row the page offered it on.
			newest := shown[len(shown)-1]
			_, newest, _ = strings.Cut(newest, ":")
			require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE target - 'through' = $1::jsonb AND result_count = $2
				AND target->>'through' = $3`, tc.target, len(shown), newest), "recorded with its filter, its bound and its count")
		})
	}
}

// actedOn is the state of every dead letter ("dead:ID") and outbox row
// ("outbox:ID").
func (e *env) actedOn(t *testing.T) map[string]string {
	t.Helper()
	rows, err := e.pool.Query(t.Context(), `
		SELECT 'dead:' || id, status FROM dead_letters
		UNION ALL SELECT 'outbox:' || id, concat_ws(',', parked_at IS NULL, discarded_at IS NULL, next_attempt_at) FROM outbox_state`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{ k, v string }, error) {
		var kv struct{ k, v string }
		return kv, r.Scan(&kv.k, &kv.v)
	})
	require.NoError(t, err)
	m := map[string]string{}
	for _, kv := range out {
		m[kv.k] = kv.v
	}
	return m
}
