package console

import (
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// The search's queries join Queries (TestQueriesUseIndexes), each shape
// of the page's query with every criterion it tests, with SearchQueryArgs
// their arguments.
func init() {
	for name, q := range searchQueries() {
		Queries[name] = q
	}
}

func searchQueries() map[string]string {
	all := searchSpec{eventType: true, topic: true, from: true, to: true, merc: true}
	out := map[string]string{
		"search id bounds": qIDBounds, "search id probe": qIDProbe, "search choices": qSearchChoices,
		"search merchants": qMerchants, "search merchant": qMerchant, "search merchant payments": qMerchantPayments,
		"blockers": qBlockers, "search aggregate type": qAggregateTypeExists,
	}
	for _, m := range []struct {
		name string
		mode searchMode
	}{{"range", byRange}, {"message", byMessage}, {"aggregate", byAggregate}, {"payments", byPayments}} {
		for _, asc := range []bool{false, true} {
			s := all
			s.mode, s.asc = m.mode, asc
			name := "search page " + m.name
			if asc {
				name += " after"
			}
			out[name] = s.pageSQL()
			if m.mode != byRange && !asc {
				out["search count "+m.name] = s.countSQL()
			}
		}
		bare := searchSpec{mode: m.mode}
		out["search page "+m.name+" unfiltered"] = bare.pageSQL()
	}
	return out
}

// SearchQueryArgs are the arguments of the search's queries in Queries.
var SearchQueryArgs = func() map[string][]any {
	named := pgx.NamedArgs{"lo": int64(0), "hi": int64(math.MaxInt64), "budget": searchBudget, "limit": 51, "count_max": searchCountMax + 1,
		"payment_type": "payment", "event_type": "payment.paid", "topic": "payments", "from": time.Now().Add(-time.Hour), "to": time.Now(),
		"merchant": "00000000-0000-0000-0000-000000000001", "message_id": "00000000-0000-0000-0000-000000000001",
		"aggregate_type": "payment", "aggregate_id": "p1", "payments": []string{"p1", "p2"}, "pos_version": int64(3), "pos_id": int64(1000)}
	out := map[string][]any{
		"search id bounds": nil, "search id probe": {1, 1000}, "search choices": {1000, searchChoicesRows, 1, 100, searchChoicesSamples, searchChoicesSample},
		"search merchants": {"00000000-0000-0000-0000-000000000000", merchantsMax + 1}, "search merchant": {"00000000-0000-0000-0000-000000000001"},
		"search merchant payments": {"00000000-0000-0000-0000-000000000001", merchantPaymentsMax + 1},
		"blockers":                 {[]string{"notify-merchant"}, "payment", "p1", 5},
		"search aggregate type":    {"payment"},
	}
	for name := range searchQueries() {
		if _, ok := out[name]; !ok {
			out[name] = []any{named}
		}
	}
	return out
}()
