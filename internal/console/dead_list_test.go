package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	deadRowRe  = regexp.MustCompile(`<tr class="dead-row" id="dead-(\d+)"`)
	nextPageRe = regexp.MustCompile(`class="next-page" href="([^"]+)"`)
)

// The /dead list pages by keyset through every open dead letter of its
// filter, in id order, whatever the filter: each page merges the statuses'
// branches, so rows of different statuses and consumers interleave on a
// page and across pages, and a page ends exactly where the next begins (no
// row twice, none skipped). Resolved and discarded rows never show.
func TestDeadListPagesInIDOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2: most filters take several pages
	type row struct {
		id               int64
		consumer, status string
	}
	// Statuses and consumers in an order that interleaves them over the
	// ids, open and closed rows alike.
	statuses := []string{"dead", "held", "resolved", "retrying", "dead", "discarded", "retrying", "held"}
	consumerNames := []string{"notify-merchant", "analytics", "legacy"}
	var rows []row
	for i := range 23 {
		r := row{consumer: consumerNames[i%len(consumerNames)], status: statuses[i%len(statuses)]}
		r.id = e.insertDead(t, r.consumer, fmt.Sprintf("00000000-0000-0000-0000-%012d", i+1), "agg-"+strconv.Itoa(i), 1, r.status)
		rows = append(rows, r)
	}
	open := map[string]bool{"retrying": true, "dead": true, "held": true}

	c := e.client(t)
	e.login(t, c)
	for _, tt := range []struct{ consumer, status string }{
		{"", ""}, {"analytics", ""}, {"", "dead"}, {"", "retrying"}, {"", "held"},
		{"notify-merchant", "held"}, {"legacy", "retrying"}, {"analytics", "dead"}, {"nobody", ""}, {"nobody", "dead"},
	} {
		t.Run(tt.consumer+"/"+tt.status, func(t *testing.T) {
			var want []int64
			for _, r := range rows {
				if open[r.status] && (tt.consumer == "" || r.consumer == tt.consumer) && (tt.status == "" || r.status == tt.status) {
					want = append(want, r.id)
				}
			}
			var got []int64
			path := "/dead?" + url.Values{"consumer": {tt.consumer}, "status": {tt.status}}.Encode()
			for pages := 0; path != ""; pages++ {
				require.Less(t, pages, len(rows), "the pages never end")
				res, body := do(t, c, http.MethodGet, e.srv.URL+path, nil)
				require.Equal(t, http.StatusOK, res.StatusCode, body)
				ids := deadRowRe.FindAllStringSubmatch(body, -1)
				require.LessOrEqual(t, len(ids), 2, "a page holds PageSize rows at most")
				for _, m := range ids {
					id, err := strconv.ParseInt(m[1], 10, 64)
					require.NoError(t, err)
					got = append(got, id)
				}
				path = ""
				if m := nextPageRe.FindStringSubmatch(body); m != nil {
					path = strings.ReplaceAll(m[1], "&amp;", "&")
					require.Len(t, ids, 2, "only a full page has a next one")
				}
			}
			require.True(t, slices.IsSorted(got), "id order: %v", got)
			require.Equal(t, want, got)
		})
	}
}

// A status filter that is not an open status is refused, naming the
// field, rather than silently listing every open dead letter.
func TestDeadListRefusesUnknownStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	e.login(t, c)
	for _, status := range []string{"resolved", "discarded", "bogus"} {
		res, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?status="+status, nil)
		require.Equal(t, http.StatusBadRequest, res.StatusCode, status)
		require.Contains(t, body, "status must be empty or one of retrying, dead, held", status)
	}
}
