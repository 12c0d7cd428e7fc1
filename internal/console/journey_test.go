package console_test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

var (
	journeyEventRe = regexp.MustCompile(`<section class="event" id="event-(\d+)" data-message-id="[^"]+"( data-focus="true")?>\s*<h2>v(\d+) `)
	earlierRe      = regexp.MustCompile(`class="earlier-page" href="([^"]+)"`)
	laterRe        = regexp.MustCompile(`class="later-page" href="([^"]+)"`)
)

type shownEvent struct {
	id, version int64
	focus       bool
}

func shownEvents(t *testing.T, body string) []shownEvent {
	t.Helper()
	var out []shownEvent
	for _, m := range journeyEventRe.FindAllStringSubmatch(body, -1) {
		id, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		v, err := strconv.ParseInt(m[3], 10, 64)
		require.NoError(t, err)
		out = append(out, shownEvent{id: id, version: v, focus: m[2] != ""})
	}
	return out
}

func link(re *regexp.Regexp, body string) string {
	m := re.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "&amp;", "&")
}

// A long-lived aggregate's journey comes in pages of Config.PageSize in
// version order, published and pending rows merged: walked back from the
// newest page (where a lookup by aggregate id opens) and forward from the
// oldest, each shows every event exactly once, in order, and the links
// keep the query. A lookup by message id opens the page holding that
// message, marked, with the events just before it.
func TestJourneyPages(t *testing.T) {
	t.Parallel()
	const events, pageSize = 130, 20
	e := newEnv(t, func(c *console.Config) { c.PageSize = pageSize })
	agg := "0190c0de-0000-7000-8000-0000000000aa"
	// Inserted in no order, so that ids do not follow versions; another
	// aggregate's rows in between. v1-v120 published but v60 (put back
	// after a broker's loss), v121 parked, the rest pending behind it.
	versions := rand.Perm(events)
	ids := map[int64]int64{} // version -> outbox id
	for _, i := range versions {
		v := int64(i + 1)
		ids[v] = e.insertOutbox(t, agg, int(v), v <= 120 && v != 60, v == 121)
		if v%10 == 0 {
			e.insertOutbox(t, "another", int(v), true, false)
		}
	}
	c := e.client(t)
	e.login(t, c)
	get := func(path string) string {
		t.Helper()
		res, body := do(t, c, http.MethodGet, e.srv.URL+path, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		return body
	}
	versionsOf := func(page []shownEvent) []int64 {
		var vs []int64
		for _, ev := range page {
			require.Equal(t, ids[ev.version], ev.id, "v%d is its own row", ev.version)
			vs = append(vs, ev.version)
		}
		return vs
	}
	span := func(from, to int64) []int64 {
		var vs []int64
		for v := from; v <= to; v++ {
			vs = append(vs, v)
		}
		return vs
	}
	all := span(1, events)

	// Back from the newest page.
	body := get("/journey?q=" + agg)
	require.Equal(t, span(111, 130), versionsOf(shownEvents(t, body)), "a lookup by aggregate id opens at the newest events")
	require.Empty(t, link(laterRe, body), "nothing later than the newest page")
	require.Contains(t, body, `<dd class="parked">`, "the parked row is on it")
	var seen []int64
	pages := 0
	for {
		pages++
		seen = append(versionsOf(shownEvents(t, body)), seen...)
		next := link(earlierRe, body)
		if next == "" {
			break
		}
		require.Contains(t, next, "q="+url.QueryEscape(agg)+"&", "the link keeps q")
		body = get(next)
	}
	require.Equal(t, all, seen, "every event once, in version order, walking back")
	require.Equal(t, 7, pages)

	// Forward from the oldest: the last page walked back above.
	require.Equal(t, span(1, 10), versionsOf(shownEvents(t, body)), "the oldest page is what is left")
	seen, pages = nil, 0
	for {
		pages++
		seen = append(seen, versionsOf(shownEvents(t, body))...)
		next := link(laterRe, body)
		if next == "" {
			break
		}
		require.Contains(t, next, "q="+url.QueryEscape(agg)+"&", "the link keeps q")
		body = get(next)
	}
	require.Equal(t, all, seen, "every event once, in version order, walking forward")
	require.Equal(t, 7, pages)

	// By message id: v97's page, v97 marked, the few events before it
	// shown first.
	m97 := e.messageID(t, ids[97])
	body = get("/journey?q=" + url.QueryEscape(m97))
	page := shownEvents(t, body)
	require.Equal(t, span(92, 111), versionsOf(page), "five events before the message, then the page's rest")
	for _, ev := range page {
		require.Equal(t, ev.version == 97, ev.focus, "v%d marked", ev.version)
	}
	require.Contains(t, body, `<a href="#event-`+strconv.FormatInt(ids[97], 10)+`" id="journey-focus">v97</a>`)
	require.Contains(t, link(earlierRe, body), "q="+url.QueryEscape(m97)+"&", "the links keep the message id")

	m125 := e.messageID(t, ids[125])
	body = get("/journey?q=" + url.QueryEscape(m125))
	require.Equal(t, span(111, 130), versionsOf(shownEvents(t, body)), "a page near the newest is filled with earlier events")
	require.Empty(t, link(laterRe, body))
	m3 := e.messageID(t, ids[3])
	body = get("/journey?q=" + url.QueryEscape(m3))
	require.Equal(t, span(1, 20), versionsOf(shownEvents(t, body)), "the oldest events, and the page's rest")
	require.Empty(t, link(earlierRe, body), "nothing before v1")
	// From the message's page on: the earlier page ends just before it.
	body = get("/journey?q=" + url.QueryEscape(m97))
	body = get(link(earlierRe, body))
	require.Equal(t, span(72, 91), versionsOf(shownEvents(t, body)))
	require.NotEmpty(t, link(earlierRe, body))
	body = get(link(laterRe, body))
	page = shownEvents(t, body)
	require.Equal(t, span(92, 111), versionsOf(page), "and its later page is the message's again")
	require.True(t, page[5].focus, "v97 still marked: the links keep q")

	// A position past either end: an empty page, no link to follow.
	body = get("/journey?q=" + agg + "&after=130." + strconv.FormatInt(ids[130], 10))
	require.Empty(t, shownEvents(t, body))
	require.Empty(t, link(laterRe, body))
	require.Contains(t, body, `id="journey-past-end"`, "not the message of a query that found nothing")

	// The links name the aggregate: once retention purged the message the
	// page was opened by, they still lead through the aggregate's events.
	earlier := link(earlierRe, get("/journey?q="+url.QueryEscape(m97)))
	_, err := e.pool.Exec(context.Background(), `DELETE FROM outbox WHERE id = $1`, ids[97])
	require.NoError(t, err)
	require.Equal(t, span(72, 91), versionsOf(shownEvents(t, get(earlier))), "the earlier page after the purge")
}

// The journey's after= and before= are positions its own links write: any
// other value is a 400 naming the field.
func TestJourneyBadPosition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.insertOutbox(t, "p1", 1, true, false)
	c := e.client(t)
	e.login(t, c)
	for q, field := range map[string]string{
		"after=abc": "after", "after=1": "after", "after=1.x": "after", "before=-1.2": "before", "before=1.2.3": "before",
		"after=1.2&before=3.4": "after or before",
	} {
		res, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q=p1&"+q, nil)
		require.Equal(t, http.StatusBadRequest, res.StatusCode, q)
		require.Contains(t, body, field, q)
	}
}
