package console_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

// deadWithError adds an open dead letter of consumer with its error text.
func (e *env) deadWithError(t *testing.T, consumer, status, errText string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata,
		                          status, reason, error, attempts)
		VALUES ($1, gen_random_uuid(), 'payment.paid', 'payment', gen_random_uuid()::text, 1, '\x7b7d', '{}', $2, 'failed', $3, 5)
		RETURNING id`, consumer, status, errText).Scan(&id))
	return id
}

var optionRe = regexp.MustCompile(`<option value="([^"]*)"`)

// options are the values of the <select id=id> in body.
func options(t *testing.T, body, id string) []string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<select name="[^"]+" id="` + id + `">(.*?)</select>`).FindStringSubmatch(body)
	require.NotNil(t, m, "no select #%s", id)
	var out []string
	for _, o := range optionRe.FindAllStringSubmatch(m[1], -1) {
		out = append(out, html.UnescapeString(o[1]))
	}
	return out
}

func ids(body string, re *regexp.Regexp) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }

// The filters offer what exists: the consumers configured and those with
// open dead letters (not one whose letters are all resolved), the open
// statuses; the topics of parked rows and the configured consumers'.
func TestListFiltersOfferWhatExists(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deadWithError(t, "sync-analytics", "dead", "boom")
	e.deadWithError(t, "legacy", "held", "")
	e.deadWithError(t, "gone", "resolved", "boom")
	r := e.insertOutbox(t, "r1", 1, false, true)
	e.exec(t, `UPDATE outbox SET topic = 'refunds' WHERE id = $1`, r)
	c := e.client(t)
	e.login(t, c)

	res, body := do(t, c, http.MethodGet, e.srv.URL+"/dead", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, []string{"", "analytics", "legacy", "notify-merchant", "sync-analytics"}, options(t, body, "dead-consumer"))
	require.Equal(t, []string{"", "dead", "retrying", "held"}, options(t, body, "dead-status"))
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/parked", nil)
	require.Equal(t, []string{"", "payments", "refunds"}, options(t, body, "parked-topic"))
}

// A filter value that matches no known consumer or topic is never a
// silent "No dead letter.": a case-insensitive match that finds exactly
// one lists it, and says so; otherwise the page names what it may have
// meant, or the known values.
func TestListFilterCaseAndUnknownValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.deadWithError(t, "sync-analytics", "dead", "boom")
	e.deadWithError(t, "notify-merchant", "dead", "boom")
	e.insertOutbox(t, "p1", 1, false, true)
	c := e.client(t)
	e.login(t, c)
	rowRe := regexp.MustCompile(`<tr class="dead-row" id="dead-(\d+)"`)

	res, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=Sync-Analytics", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, []string{itoa(a)}, ids(body, rowRe), "the one consumer it can mean")
	requireText(t, body, "filter-note", `No consumer is named &#34;Sync-Analytics&#34;: showing sync-analytics (names are case-sensitive).`)
	require.Contains(t, body, `<option value="sync-analytics" selected>`)
	require.Contains(t, body, `name="consumer" value="sync-analytics"`, "the actions act on the consumer shown")

	for _, tc := range []struct{ q, hint string }{
		{"sync", `No consumer named &#34;sync&#34;; did you mean sync-analytics?`},
		{"nobody", `No consumer named &#34;nobody&#34;; the known ones are analytics, notify-merchant, sync-analytics.`},
	} {
		_, body = do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer="+tc.q, nil)
		require.Empty(t, ids(body, rowRe))
		requireText(t, body, "filter-hint", tc.hint)
		require.NotContains(t, body, "No dead letter.", "never silent")
	}
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/parked?topic=Payments", nil)
	requireText(t, body, "filter-note", `No topic is named &#34;Payments&#34;: showing payments (names are case-sensitive).`)
	require.Len(t, ids(body, regexp.MustCompile(`id="parked-(\d+)"`)), 1)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/parked?topic=refund", nil)
	requireText(t, body, "filter-hint", `No topic named &#34;refund&#34;; the known ones are payments.`)
}

// The lists page both ways by keyset, with First, Previous and Next and
// where the page is in the total: Next to the end, then Previous back to
// the start, each page the same rows both ways.
func TestListPagesBothWaysWithTotals(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2
	var all []string
	for i := range 7 {
		all = append(all, itoa(e.deadWithError(t, "analytics", "dead", "boom")))
		e.deadWithError(t, "notify-merchant", "dead", fmt.Sprint("other ", i)) // interleaved, filtered out
	}
	c := e.client(t)
	e.login(t, c)
	rowRe := regexp.MustCompile(`<tr class="dead-row" id="dead-(\d+)"`)
	link := func(body, class string) string {
		m := regexp.MustCompile(`class="` + class + `" href="([^"]+)"`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return html.UnescapeString(m[1])
	}
	showing := func(body string) string {
		m := regexp.MustCompile(`<span class="showing">([^<]*)</span>`).FindStringSubmatch(body)
		require.NotNil(t, m)
		return m[1]
	}
	path := "/dead?consumer=analytics"
	var pages [][]string
	for want := 1; path != ""; want += 2 {
		_, body := do(t, c, http.MethodGet, e.srv.URL+path, nil)
		got := ids(body, rowRe)
		pages = append(pages, got)
		require.Equal(t, fmt.Sprintf("Showing %d–%d of 7", want, want+len(got)-1), showing(body))
		if want == 1 {
			require.Empty(t, link(body, "prev-page"), "the first page has no previous")
			require.Empty(t, link(body, "first-page"))
		} else {
			require.Equal(t, "/dead?consumer=analytics", link(body, "first-page"))
		}
		path = link(body, "next-page")
		if path != "" {
			require.Contains(t, path, "consumer=analytics", "the filter kept")
		}
	}
	require.Equal(t, [][]string{all[0:2], all[2:4], all[4:6], all[6:7]}, pages)

	// Back from the last page: before= its first row.
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics&after="+all[5], nil)
	for i := len(pages) - 2; i >= 0; i-- {
		path = link(body, "prev-page")
		require.NotEmpty(t, path, "page %d has a previous", i+1)
		require.Contains(t, path, "before=")
		_, body = do(t, c, http.MethodGet, e.srv.URL+path, nil)
		require.Equal(t, pages[i], ids(body, rowRe), "page %d, reached backwards", i)
		require.Equal(t, fmt.Sprintf("Showing %d–%d of 7", 2*i+1, 2*i+2), showing(body))
		require.NotEmpty(t, link(body, "next-page"), "a page reached backwards has a next")
	}
	require.Empty(t, link(body, "prev-page"), "back at the first page")

	res, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?after=x", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Contains(t, body, "after must be a row id")
	res, _ = do(t, c, http.MethodGet, e.srv.URL+"/parked?after=1&before=3", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)

	// Every id a link: the row's id to its journey, its consumer to its list.
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics", nil)
	require.Regexp(t, `<a href="/journey\?q=[0-9a-f-]{36}" class="id-link"[^>]*>#\d+</a>`, body)
	require.Contains(t, body, `<a href="/dead?consumer=analytics" class="consumer-link">analytics</a>`)
}

// Past countCap the total says so ("10,000+") rather than count on.
func TestListTotalIsCapped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata,
		                          status, reason, error, attempts)
		SELECT 'analytics', gen_random_uuid(), 'payment.paid', 'payment', 'p' || i, 1, '\x7b7d', '{}', 'dead', 'failed', 'boom', 5
		FROM generate_series(1, $1::int) i`, console.CountCap+5)
	c := e.client(t)
	e.login(t, c)
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics", nil)
	require.Contains(t, body, `<span class="showing">Showing 1–2 of 10,000&#43;</span>`)
	require.Contains(t, body, `data-confirm="Retry all 10,000&#43; dead letters matching consumer=analytics, status=dead?`)
}

// The confirmations, the browser's (data-confirm) and the server's page,
// state the action, the count and the target.
func TestConfirmationsNameCountAndTarget(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var sync []string
	for range 3 {
		sync = append(sync, itoa(e.deadWithError(t, "sync-analytics", "dead", "boom")))
	}
	other := itoa(e.deadWithError(t, "analytics", "dead", "boom"))
	e.deadWithError(t, "analytics", "held", "")
	c := e.client(t)
	csrf := e.login(t, c)

	_, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=sync-analytics&status=dead", nil)
	require.Contains(t, body, `data-confirm="Retry all 3 dead letters matching consumer=sync-analytics, status=dead? The consumer tries them again at once."`)
	require.Contains(t, body, `data-confirm="Discard all 3 dead letters matching consumer=sync-analytics, status=dead? They are recorded as handled without running the handler."`)
	require.Regexp(t, `<button type="submit" formaction="/dead/discard" class="danger" id="dead-discard-selected"`, body, "discard looks destructive")
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/dead", nil)
	require.Contains(t, body, `data-confirm="Retry all 4 dead letters matching status=dead?`, "of every consumer: the dead ones, not the held")

	for _, tc := range []struct {
		path   string
		form   url.Values
		want   string
		danger bool
	}{
		{"/dead/discard", url.Values{"id": sync}, "Discard 3 dead letters of consumer sync-analytics?", true},
		{"/dead/retry", url.Values{"id": append([]string{other}, sync[:2]...)}, "Retry 3 dead letters of consumers analytics (1), sync-analytics (2)?", false},
		{"/dead/retry", url.Values{"all": {"1"}, "consumer": {"sync-analytics"}, "status": {"dead"}},
			"Retry all 3 dead letters matching consumer=sync-analytics, status=dead?", false},
		{"/dead/discard", url.Values{"all": {"1"}}, "Discard all 4 dead letters matching status=dead?", true},
		{"/parked/discard", url.Values{"all": {"1"}}, "Discard all 0 parked rows of every topic?", true},
	} {
		tc.form.Set("csrf_token", csrf)
		res, body := do(t, c, http.MethodPost, e.srv.URL+tc.path, tc.form)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		requireText(t, body, "confirm-question", tc.want)
		require.Equal(t, tc.danger, strings.Contains(body, `id="confirm-submit" class="danger"`), "%s: destructive", tc.path)
	}
}

// "All matching the filter" acts on exactly what was confirmed: the rows
// up to the newest the operator was shown (through=), on the page's
// buttons and on the server's confirmation alike; a row arriving between
// the confirmation and the action is untouched, and the record says the
// filter and the bound.
func TestActionOnAllIsBoundToWhatWasConfirmed(t *testing.T) {
	t.Parallel()
	for _, viaPage := range []bool{true, false} {
		t.Run(fmt.Sprintf("confirmation page %v", !viaPage), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			a := e.deadWithError(t, "analytics", "dead", "boom")
			b := e.deadWithError(t, "analytics", "dead", "boom")
			c := e.client(t)
			csrf := e.login(t, c)
			_, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics&status=dead", nil)
			form, offered := listForm(t, body, "dead-form", "dead-retry-all")
			require.True(t, offered)
			require.Equal(t, itoa(b), form.Get("through"), "the page binds all to its newest row")
			if !viaPage {
				form.Del("confirm")
				res, body := do(t, c, http.MethodPost, e.srv.URL+"/dead/retry", form)
				require.Equal(t, http.StatusOK, res.StatusCode)
				requireText(t, body, "confirm-question", "Retry all 2 dead letters matching consumer=analytics, status=dead?")
				form, _ = listForm(t, body, "confirm-form", "confirm-submit")
				form.Del("all")
				form.Set("all", "1")
				require.Equal(t, itoa(b), form.Get("through"))
			}
			late := e.deadWithError(t, "analytics", "dead", "boom") // arrives after the confirmation
			form.Set("csrf_token", csrf)
			res, _ := do(t, c, http.MethodPost, e.srv.URL+"/dead/retry", form)
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			for id, want := range map[int64]string{a: "retrying", b: "retrying", late: "dead"} {
				require.Equal(t, 1, e.count(t, `SELECT count(*) FROM dead_letters WHERE id = $1 AND status = $2`, id, want), "%d", id)
			}
			require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'dlq.retry' AND result_count = 2
				AND target = jsonb_build_object('all', true, 'consumer', 'analytics', 'status', 'dead', 'through', $1::bigint)`, b))
		})
	}
	t.Run("parked", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		p := e.insertOutbox(t, "p1", 1, false, true)
		c := e.client(t)
		csrf := e.login(t, c)
		_, body := do(t, c, http.MethodGet, e.srv.URL+"/parked", nil)
		form, offered := listForm(t, body, "parked-form", "parked-discard-all")
		require.True(t, offered)
		late := e.insertOutbox(t, "p2", 1, false, true)
		form.Set("csrf_token", csrf)
		res, _ := do(t, c, http.MethodPost, e.srv.URL+"/parked/discard", form)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_failures WHERE id = $1 AND discarded_at IS NOT NULL`, p))
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_failures WHERE id = $1 AND parked_at IS NOT NULL AND discarded_at IS NULL`, late),
			"the row parked after the confirmation is untouched")
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE target = jsonb_build_object('all', true, 'through', $1::bigint)`, p))
	})
}

// Above each list, the errors of its filter grouped with their counts,
// most frequent first; each filters the list by that error, and "all"
// then acts on the rows with that error only.
func TestErrorsGroupedAndTheErrorFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = 50 })
	const constraint = `pq: insert violates check constraint "ledger_positive"`
	var withIt []int64
	for range 3 {
		withIt = append(withIt, e.deadWithError(t, "analytics", "dead", constraint))
	}
	timeout := e.deadWithError(t, "analytics", "dead", "context deadline exceeded")
	e.deadWithError(t, "notify-merchant", "dead", "elsewhere")
	c := e.client(t)
	csrf := e.login(t, c)

	_, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics", nil)
	groups := regexp.MustCompile(`(?s)<span class="num count">([^<]+)</span>\s*<a href="([^"]+)" class="error-filter-link error">([^<]+)</a>`).
		FindAllStringSubmatch(body, -1)
	require.Len(t, groups, 2, "the consumer's errors only")
	require.Equal(t, "3×", groups[0][1])
	require.Equal(t, html.EscapeString(constraint), groups[0][3])
	require.Equal(t, "1×", groups[1][1])
	require.Contains(t, body, "Errors, among the 4 matching rows")

	path := html.UnescapeString(groups[0][2])
	require.Equal(t, "/dead?consumer=analytics&error="+url.QueryEscape(constraint), path)
	_, body = do(t, c, http.MethodGet, e.srv.URL+path, nil)
	rowRe := regexp.MustCompile(`<tr class="dead-row" id="dead-(\d+)"`)
	require.Equal(t, []string{itoa(withIt[0]), itoa(withIt[1]), itoa(withIt[2])}, ids(body, rowRe))
	require.Contains(t, body, `<span class="showing">Showing 1–3 of 3</span>`)
	require.Contains(t, body, `data-confirm="Discard all 3 dead letters matching consumer=analytics, status=dead, error=&#34;`+
		`pq: insert violates check constraint \&#34;ledger_positive\&#34;&#34;?`)

	form, offered := listForm(t, body, "dead-form", "dead-discard-all")
	require.True(t, offered)
	require.Equal(t, constraint, form.Get("error"))
	form.Set("csrf_token", csrf)
	res, _ := do(t, c, http.MethodPost, e.srv.URL+"/dead/discard", form)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, 3, e.count(t, `SELECT count(*) FROM dead_letters WHERE id = ANY($1) AND status = 'discarded'`, withIt))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM dead_letters WHERE id = $1 AND status = 'dead'`, timeout), "another error: untouched")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE target->>'error' = $1 AND result_count = 3`, constraint))

	// Parked rows: grouped by their last error too.
	p := e.insertOutbox(t, "p1", 1, false, true)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/parked", nil)
	require.Contains(t, body, `<a href="/parked?error=broker&#43;said&#43;no" class="error-filter-link error">broker said no</a>`)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/parked?error=broker+said+no", nil)
	require.Equal(t, []string{itoa(p)}, ids(body, regexp.MustCompile(`id="parked-(\d+)"`)))
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/parked?error=other", nil)
	require.Empty(t, ids(body, regexp.MustCompile(`id="parked-(\d+)"`)))
}

// A link to one row (at=<id>, as a journey's link to a dead letter may
// write it) opens the page that starts at it, the row marked, whatever
// page it is on; at= that is not a row id is a 400.
func TestListLinkToARow(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2
	var all []string
	for range 5 {
		all = append(all, itoa(e.deadWithError(t, "analytics", "dead", "boom")))
	}
	c := e.client(t)
	e.login(t, c)
	rowRe := regexp.MustCompile(`<tr class="dead-row" id="dead-(\d+)"`)
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics&at="+all[3], nil)
	require.Equal(t, all[3:5], ids(body, rowRe))
	require.Regexp(t, `id="dead-`+all[3]+`"[^>]*data-focus="true"`, body)
	require.Contains(t, body, `<span class="showing">Showing 4–5 of 5</span>`)
	require.Contains(t, body, `class="prev-page" href="/dead?before=`+all[3]+`&amp;consumer=analytics"`)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/dead?at="+all[0], nil)
	require.Equal(t, all[0:2], ids(body, rowRe))
	require.NotContains(t, body, `class="prev-page"`, "the first row: no page before")
	for _, bad := range []string{"at=x", "at=0", "at=3&after=1"} {
		res, _ := do(t, c, http.MethodGet, e.srv.URL+"/dead?"+bad, nil)
		require.Equal(t, http.StatusBadRequest, res.StatusCode, bad)
	}
}
