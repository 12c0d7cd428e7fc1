package console_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

var (
	searchRowRe   = regexp.MustCompile(`class="search-row" id="row-(\d+)"`)
	searchNextRe  = regexp.MustCompile(`class="next-page" href="([^"]+)"`)
	searchPrevRe  = regexp.MustCompile(`class="previous-page" href="([^"]+)"`)
	searchFirstRe = regexp.MustCompile(`class="first-page" href="([^"]+)"`)
	searchCountR  = regexp.MustCompile(`<span id="search-count">([^<]+)</span>`)
)

// searchLink is the href of the pager's link re matches, unescaped as a
// browser reads it.
func searchLink(re *regexp.Regexp, body string) string {
	m := re.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// insertEvent adds an outbox row created at created and returns its id.
func (e *env) insertEvent(t *testing.T, aggType, aggID string, version int, eventType, topic string, created time.Time) int64 {
	t.Helper()
	var id int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at, created_at)
		VALUES (gen_random_uuid(), $1, $2, $3, $4, $5, '{}', $6, $6) RETURNING id`,
		topic, aggType, aggID, version, eventType, created).Scan(&id))
	return id
}

// shownRows are the outbox ids of a search page's rows, in order.
func shownRows(t *testing.T, body string) []int64 {
	t.Helper()
	var out []int64
	for _, m := range searchRowRe.FindAllStringSubmatch(body, -1) {
		id, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		out = append(out, id)
	}
	return out
}

// newest is ids, newest (highest id) first.
func newest(ids ...int64) []int64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

func (e *env) search(t *testing.T, c *http.Client, q string) (int, string) {
	t.Helper()
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/search?"+q, nil)
	return res.StatusCode, body
}

// Each criterion of the search finds the rows it names and only those,
// newest first: a message id, a payment (aggregate) id, a merchant (its
// payments' events, through the app's tables), an event type, a topic, a
// time window ([from, to), in UTC, and a preset up to now), and these
// combined; a count where it is cheap.
func TestSearchCriteria(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = 50; c.EventTypes = []string{"payment.disputed"} })
	const (
		mA = "00000000-0000-0000-0000-0000000000a1"
		mB = "00000000-0000-0000-0000-0000000000b2"
		p1 = "0190c0de-0000-7000-8000-000000000001" // merchant A's
		p2 = "0190c0de-0000-7000-8000-000000000002" // merchant A's
		p3 = "0190c0de-0000-7000-8000-000000000003" // merchant B's
	)
	e.exec(t, `INSERT INTO merchants (id, name, webhook_url, webhook_secret) VALUES ($1, 'Acme', 'https://a.example', 's'), ($2, 'Bolt', 'https://b.example', 's')`, mA, mB)
	e.exec(t, `INSERT INTO payments (id, merchant_id, amount, currency, status, version, created_at, updated_at) VALUES
		($1, $4, 100, 'EUR', 'paid', 2, now(), now()), ($2, $4, 100, 'EUR', 'paid', 2, now(), now()), ($3, $5, 100, 'EUR', 'paid', 2, now(), now())`,
		p1, p2, p3, mA, mB)
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(min int) time.Time { return base.Add(time.Duration(min) * time.Minute) }
	p1c := e.insertEvent(t, "payment", p1, 1, "payment.created", "payments", at(0))
	p3c := e.insertEvent(t, "payment", p3, 1, "payment.created", "payments", at(5))
	p1p := e.insertEvent(t, "payment", p1, 2, "payment.paid", "payments", at(10))
	p2c := e.insertEvent(t, "payment", p2, 1, "payment.created", "payments", at(20))
	p3p := e.insertEvent(t, "payment", p3, 2, "payment.paid", "payments", at(30))
	p2r := e.insertEvent(t, "payment", p2, 2, "payment.refunded", "refunds", at(40))
	o1 := e.insertEvent(t, "order", p1, 1, "order.placed", "orders", at(50)) // another aggregate type, same id
	recent := e.insertEvent(t, "payment", "p-recent", 1, "payment.created", "payments", time.Now().Add(-10*time.Minute))
	c := e.client(t)
	e.login(t, c)

	for _, tc := range []struct {
		name, q string
		want    []int64
		count   string // "" when none is shown
	}{
		{"everything", "", newest(p1c, p3c, p1p, p2c, p3p, p2r, o1, recent), ""},
		{"message id", "id=" + e.messageID(t, p3p), []int64{p3p}, "1"},
		{"payment id", "id=" + p1, newest(p1c, p1p), "2"},
		{"aggregate of another type", "id=" + p1 + "&aggregate_type=order", []int64{o1}, "1"},
		{"payment id and event type", "id=" + p1 + "&event_type=payment.paid", []int64{p1p}, "1"},
		{"merchant", "merchant=" + mA, newest(p1c, p1p, p2c, p2r), "4"},
		{"merchant and event type", "merchant=" + mA + "&event_type=payment.created", newest(p1c, p2c), "2"},
		{"merchant B", "merchant=" + mB, newest(p3c, p3p), "2"},
		{"event type", "event_type=payment.paid", newest(p1p, p3p), ""},
		{"a registered type no event has", "event_type=payment.disputed", nil, ""},
		{"topic", "topic=refunds", []int64{p2r}, ""},
		// [from, to): from is in, to is out.
		{"window", "from=2026-03-01+12:10:00&to=2026-03-01T12:30:00", newest(p1p, p2c), ""},
		{"window from", "from=2026-03-01T12:40:00Z", newest(p2r, o1, recent), ""},
		{"window to", "to=2026-03-01+12:05", []int64{p1c}, ""},
		{"window and merchant", "merchant=" + mA + "&from=2026-03-01+12:05&to=2026-03-01+13:00", newest(p1p, p2c, p2r), "3"},
		{"window and type", "event_type=payment.created&from=2026-03-01+12:01", newest(p3c, p2c, recent), ""},
		{"preset", "since=1h", []int64{recent}, ""},
		{"nothing matches", "topic=orders&event_type=payment.paid", nil, ""},
	} {
		status, body := e.search(t, c, tc.q)
		require.Equal(t, http.StatusOK, status, "%s: %s", tc.name, body)
		require.Equal(t, tc.want, shownRows(t, body), tc.name)
		m := searchCountR.FindStringSubmatch(body)
		if tc.count == "" {
			require.Nil(t, m, tc.name)
		} else {
			require.NotNil(t, m, tc.name)
			require.Equal(t, tc.count, m[1], tc.name)
		}
		if len(tc.want) == 0 {
			require.Contains(t, body, `id="search-empty"`, tc.name)
		}
	}

	// A row links to its journey, focused on it; the filters offer what
	// exists: the merchants by name, the event types seen and registered.
	_, body := e.search(t, c, "id="+p1)
	mid := e.messageID(t, p1p)
	require.Contains(t, body, `<a href="/journey?q=`+mid+`#event-`+strconv.FormatInt(p1p, 10)+`" class="aggregate-link">payment <code>`+p1+`</code> v2</a>`)
	require.Contains(t, body, `<a href="/journey?q=`+mid+`#event-`+strconv.FormatInt(p1p, 10)+`" class="message-link">`)
	require.Contains(t, body, `<option value="`+mA+`">Acme</option>`)
	for _, et := range []string{"payment.created", "payment.paid", "payment.refunded", "order.placed", "payment.disputed"} {
		require.Contains(t, body, `<option value="`+et+`">`+et+`</option>`)
	}
	require.Contains(t, body, `<option value="refunds">refunds</option>`)
	// The window a preset resolves to is written back, in UTC, and the
	// links keep it.
	_, body = e.search(t, c, "since=24h&topic=payments")
	require.Regexp(t, `id="search-from" value="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"`, body)
	require.Contains(t, body, "From (UTC)")
}

// A merchant with more payments than the search reads by the aggregate
// index has its events found by the walk of the newest events, each row's
// payment looked up: the same rows.
func TestSearchMerchantOfManyPayments(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = 50 })
	const mA, mB = "00000000-0000-0000-0000-0000000000a1", "00000000-0000-0000-0000-0000000000b2"
	e.exec(t, `INSERT INTO merchants (id, name, webhook_url, webhook_secret) VALUES ($1, 'Acme', 'https://a.example', 's'), ($2, 'Bolt', 'https://b.example', 's')`, mA, mB)
	// 600 payments of A (more than the 500 read by index), one of B.
	e.exec(t, `INSERT INTO payments (id, merchant_id, amount, currency, status, version, created_at, updated_at)
		SELECT gen_random_uuid(), $1, 100, 'EUR', 'paid', 1, now(), now() FROM generate_series(1, 600)`, mA)
	e.exec(t, `INSERT INTO payments (id, merchant_id, amount, currency, status, version, created_at, updated_at)
		VALUES ('0190c0de-0000-7000-8000-0000000000b1', $1, 100, 'EUR', 'paid', 1, now(), now())`, mB)
	e.exec(t, `INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), 'payments', 'payment', id::text, 1, 'payment.created', '{}', now() FROM payments ORDER BY id`)
	e.insertEvent(t, "order", "not-a-uuid", 1, "order.placed", "orders", time.Now()) // a cast of its id would fail
	var wantB []int64
	rows, err := e.pool.Query(context.Background(), `SELECT id FROM outbox WHERE aggregate_id = '0190c0de-0000-7000-8000-0000000000b1'`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		wantB = append(wantB, id)
	}
	require.NoError(t, rows.Err())
	c := e.client(t)
	e.login(t, c)
	status, body := e.search(t, c, "merchant="+mB)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, wantB, shownRows(t, body))
	require.Contains(t, body, `<span id="search-count">1</span>`, "a merchant of few payments is counted")

	status, body = e.search(t, c, "merchant="+mA)
	require.Equal(t, http.StatusOK, status, body)
	shown := shownRows(t, body)
	require.Len(t, shown, 50)
	require.NotContains(t, shown, wantB[0])
	require.Contains(t, body, "each looked up in the merchant&#39;s payments")
	require.NotContains(t, body, `id="search-count"`, "a merchant of many payments is not counted")
	require.NotEmpty(t, searchLink(searchNextRe, body))
}

// A search pages by keyset, newest first: Next walks to the oldest, each
// row once; Previous walks back to the newest, the same pages; First
// returns to the first page. The links keep the criteria.
func TestSearchPaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var all []int64
	for i := range 9 {
		et := "payment.paid"
		if i%3 == 0 {
			et = "payment.created" // filtered out
		}
		id := e.insertEvent(t, "payment", fmt.Sprint("p", i), 1, et, "payments", base.Add(time.Duration(i)*time.Minute))
		if et == "payment.paid" {
			all = append(all, id)
		}
	}
	want := newest(all...)
	c := e.client(t)
	e.login(t, c)
	status, body := e.search(t, c, "event_type=payment.paid&from=2026-03-01+11:00")
	require.Equal(t, http.StatusOK, status, body)
	require.Empty(t, searchLink(searchPrevRe, body), "the first page has no Previous")
	require.Empty(t, searchLink(searchFirstRe, body))
	var pages [][]int64
	var got []int64
	for {
		rows := shownRows(t, body)
		require.NotEmpty(t, rows)
		pages = append(pages, rows)
		got = append(got, rows...)
		next := searchLink(searchNextRe, body)
		if next == "" {
			break
		}
		require.Contains(t, next, "event_type=payment.paid")
		require.Contains(t, next, "from=2026-03-01+11%3A00%3A00")
		status, body = do2(t, e, c, next)
		require.Equal(t, http.StatusOK, status, body)
		require.NotEmpty(t, searchLink(searchFirstRe, body))
		require.NotEmpty(t, searchLink(searchPrevRe, body))
	}
	require.Equal(t, want, got, "each row once, newest first")
	require.Len(t, pages, 3)
	// Back, page by page, from the last.
	for i := len(pages) - 2; i >= 0; i-- {
		prev := searchLink(searchPrevRe, body)
		require.NotEmpty(t, prev, "page %d", i)
		status, body = do2(t, e, c, prev)
		require.Equal(t, http.StatusOK, status, body)
		require.Equal(t, pages[i], shownRows(t, body), "page %d", i)
	}
	status, body = do2(t, e, c, searchLink(searchFirstRe, body))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, pages[0], shownRows(t, body))

	// An aggregate's events page by (version, id), the journey's position.
	for v := 2; v <= 5; v++ {
		e.insertEvent(t, "payment", "p1", v, "payment.paid", "payments", base.Add(time.Hour))
	}
	var agg []int64
	status, body = e.search(t, c, "id=p1")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<span id="search-count">5</span>`)
	for {
		agg = append(agg, shownRows(t, body)...)
		next := searchLink(searchNextRe, body)
		if next == "" {
			break
		}
		status, body = do2(t, e, c, next)
		require.Equal(t, http.StatusOK, status, body)
	}
	require.Len(t, agg, 5)
	require.True(t, slices.IsSortedFunc(agg, func(a, b int64) int { return int(b - a) }), "newest version first: %v", agg)
}

func do2(t *testing.T, e *env, c *http.Client, path string) (int, string) {
	t.Helper()
	res, body := do(t, c, http.MethodGet, e.srv.URL+path, nil)
	return res.StatusCode, body
}

// A rare match among many rows: a page reads at most its budget of rows,
// says how far back it looked, and Next goes on from there until the match.
func TestSearchStopsOnItsBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.EventTypes = []string{"payment.disputed"} })
	rare := e.insertEvent(t, "payment", "rare", 1, "payment.disputed", "payments", time.Now().Add(-time.Hour))
	e.exec(t, `INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), 'payments', 'payment', 'p' || i, 1, 'payment.paid', '{}', now() FROM generate_series(1, 12000) i`)
	c := e.client(t)
	e.login(t, c)
	status, body := e.search(t, c, "event_type=payment.disputed")
	require.Equal(t, http.StatusOK, status, body)
	require.Empty(t, shownRows(t, body))
	require.Contains(t, body, `id="search-budget">This page looked at 10,000 events`)
	next := searchLink(searchNextRe, body)
	require.NotEmpty(t, next)
	status, body = do2(t, e, c, next)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, []int64{rare}, shownRows(t, body))
	require.Empty(t, searchLink(searchNextRe, body), "the walk reached the oldest row")

	// A window's ids bound the walk: the newer rows are not read, the
	// match is on the first page.
	to := time.Now().UTC().Add(-30 * time.Minute).Format("2006-01-02 15:04:05")
	status, body = e.search(t, c, "event_type=payment.disputed&to="+url.QueryEscape(to))
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, []int64{rare}, shownRows(t, body))
	require.NotContains(t, body, `id="search-budget"`)
}

// A criterion the search cannot use is a 400 that names it: a malformed
// time, from after to, an event type, topic or aggregate type that is
// none of those offered, a malformed position, a merchant that is no
// merchant.
func TestSearchBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.insertEvent(t, "payment", "p1", 1, "payment.paid", "payments", time.Now())
	c := e.client(t)
	e.login(t, c)
	for q, field := range map[string]string{
		"from=yesterday":                "from",
		"to=2026-13-01":                 "to",
		"from=2026-03-02&to=2026-03-01": "from",
		"from=2026-03-01&to=2026-03-01": "from",
		"event_type=payment.payed":      "event_type",
		"event_type=Payment.Paid":       "event_type",
		"topic=nope":                    "topic",
		"aggregate_type=nope":           "aggregate_type",
		"since=2h":                      "since",
		"since=1h&from=2026-03-01":      "since",
		"before=12":                     "before",
		"after=x.1":                     "after",
		"before=1.1&after=1.1":          "after",
		"merchant=acme":                 "merchant",
		"merchant=00000000-0000-0000-0000-0000000000ff": "merchant",
		"id=" + strings.Repeat("x", 501):                "id",
	} {
		status, body := e.search(t, c, q)
		require.Equal(t, http.StatusBadRequest, status, q)
		require.True(t, strings.HasPrefix(body, "bad search: "+field+": "), "%s: %s", q, body)
	}
}

// In FrameworkOnly mode there are no merchants: the filter is not shown,
// and a merchant asked for is a 400.
func TestSearchFrameworkOnly(t *testing.T) {
	t.Parallel()
	srv, cl := frameworkOnlyConsole(t)
	res, body := do(t, cl, http.MethodGet, srv+"/search", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.NotContains(t, body, `id="search-merchant"`)
	require.Contains(t, body, `<option value="refund.requested">refund.requested</option>`)
	res, body = do(t, cl, http.MethodGet, srv+"/search?merchant=00000000-0000-0000-0000-0000000000a1", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode, body)
	require.True(t, strings.HasPrefix(body, "bad search: merchant: "), body)
	res, body = do(t, cl, http.MethodGet, srv+"/search?event_type=refund.requested", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Len(t, searchRowRe.FindAllString(body, -1), 1)
}

// frameworkOnlyConsole is a FrameworkOnly console on a user's schema with
// one outbox row, and a client logged in with its operator key.
func frameworkOnlyConsole(t *testing.T) (string, *http.Client) {
	t.Helper()
	s := userSchema(t)
	const key = "operator-key-of-the-refunds-service-0123456789"
	c, err := console.New(console.Config{Pool: s.Pool, InsecureCookie: true, FrameworkOnly: true, OperatorKeySHA256: sha256Of(key),
		Consumers: []console.Consumer{{Name: "refunds-projection", Topic: "refunds"}}, AggregateType: "refund"})
	require.NoError(t, err)
	srv := newServer(t, c)
	_, err = s.Pool.Exec(context.Background(), `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 'refunds', 'refund', 'r1', 1, 'refund.requested', '{}', now())`)
	require.NoError(t, err)
	cl := (&env{}).client(t)
	res, _ := do(t, cl, http.MethodPost, srv+"/login", url.Values{"api_key": {key}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	return srv, cl
}

func sha256Of(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
