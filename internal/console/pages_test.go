package console_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

func (e *env) insertDead(t *testing.T, consumer, messageID, aggID string, version int, status string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata,
		                          status, reason, error, attempts)
		VALUES ($1, $2, 'payment.paid', 'payment', $3, $4, '\x7b7d', '{}', $5, 'failed', 'ledger is closed', 5) RETURNING id`,
		consumer, messageID, aggID, version, status).Scan(&id))
	return id
}

func requireText(t *testing.T, body, id, want string) {
	t.Helper()
	m := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*>([^<]*)<`).FindStringSubmatch(body)
	require.NotNil(t, m, "no element #%s", id)
	require.Equal(t, want, strings.TrimSpace(m[1]), "#%s", id)
}

// The overview (and its live fragment) shows the numbers of the schema.
func TestOverviewShowsTheNumbers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 3 {
		e.insertOutbox(t, "pub", i+1, true, false)
	}
	e.insertOutbox(t, "pend", 1, false, false)
	e.insertOutbox(t, "pend", 2, false, false)
	e.insertOutbox(t, "park", 1, false, true)
	e.exec(t, `INSERT INTO outbox_forwarders (id, heartbeat_at) VALUES ('fwd-a', '2026-01-02 03:04:05Z')`)
	// Two partitions, their cursors where the published rows put them.
	e.exec(t, `DELETE FROM outbox_partitions WHERE partition > 1`)
	e.exec(t, `UPDATE outbox_partitions SET owner = CASE partition WHEN 0 THEN 'fwd-a' END,
		lease_until = CASE partition WHEN 0 THEN now() + interval '10s' END, published_total = CASE partition WHEN 0 THEN 5 ELSE 2 END`)
	e.insertDead(t, "notify-merchant", "00000000-0000-0000-0000-000000000001", "a", 1, "dead")
	e.insertDead(t, "notify-merchant", "00000000-0000-0000-0000-000000000002", "a", 2, "held")
	e.insertDead(t, "notify-merchant", "00000000-0000-0000-0000-000000000003", "b", 1, "retrying")
	e.insertDead(t, "notify-merchant", "00000000-0000-0000-0000-000000000004", "c", 1, "resolved")
	e.insertDead(t, "legacy", "00000000-0000-0000-0000-000000000005", "d", 1, "dead")
	e.insertDelivery(t, "pending", 0, "")
	e.insertDelivery(t, "pending", 2, "HTTP 500")
	e.insertDelivery(t, "failed", 9, "HTTP 410")
	e.insertDelivery(t, "delivered", 1, "")
	// A due one, waiting for 90 s; another endpoint disabled, a third's
	// circuit open.
	due := e.insertDelivery(t, "pending", 0, "")
	e.exec(t, `UPDATE webhook_endpoint_deliveries SET next_attempt_at = now() - interval '90 seconds' WHERE id = $1`, due)
	e.hookEndpoint(t, testAccount, "https://merchant.example/off")
	e.exec(t, `UPDATE webhook_endpoints SET disabled_at = now(), disabled_reason = 'failing' WHERE url = 'https://merchant.example/off'`)
	e.hookEndpoint(t, "acct-b", "https://b.example/hooks")
	e.exec(t, `UPDATE webhook_endpoints SET circuit_open_until = now() + interval '1 minute', consecutive_failures = 5 WHERE account_id = 'acct-b'`)

	c := e.client(t)
	e.login(t, c)
	for _, path := range []string{"/", "/fragments/overview"} {
		res, body := do(t, c, http.MethodGet, e.srv.URL+path, nil)
		require.Equal(t, http.StatusOK, res.StatusCode)
		requireText(t, body, "outbox-pending", "2")
		// Problems stand out (a class) and link to their list; zeros are muted.
		require.Contains(t, body, `id="outbox-parked"><a href="/parked" class="bad">1</a>`)
		requireText(t, body, "outbox-published-total", "7")
		requireText(t, body, "webhooks-pending", "3")
		require.Contains(t, body, `id="webhooks-failing"><a href="/webhooks?status=failing" class="warn">1</a>`)
		require.Contains(t, body, `id="webhooks-failed"><a href="/webhooks?status=failed" class="bad">1</a>`)
		require.Contains(t, body, `id="webhooks-endpoints-disabled"><span class="warn">1</span>`)
		require.Contains(t, body, `id="webhooks-circuit-open"><span class="warn">1</span>`)
		require.Regexp(t, `id="webhooks-oldest-due">1 min`, body)
		require.Regexp(t, `data-consumer="notify-merchant"><td>notify-merchant</td><td class="secondary">payments</td>\s*<td class="lag">n/a</td>\s*`+
			`<td class="held"><a href="/dead\?consumer=notify-merchant&amp;status=held" class="warn">1</a></td>\s*`+
			`<td class="retrying"><a href="/dead\?consumer=notify-merchant&amp;status=retrying" class="warn">1</a></td>\s*`+
			`<td class="dead"><a href="/dead\?consumer=notify-merchant&amp;status=dead" class="bad">1</a>`, body)
		require.Regexp(t, `data-consumer="analytics">[^\n]*\s*<td class="lag">n/a</td>\s*<td class="held"><span class="zero">0</span></td>\s*`+
			`<td class="retrying"><span class="zero">0</span></td>\s*<td class="dead"><span class="zero">0</span></td>`, body)
		require.Contains(t, body, `data-consumer="legacy"`, "a consumer with dead letters shows though not configured")
		require.Regexp(t, `data-partition="0"><td>0</td><td class="owner">fwd-a</td>\s*<td><time[^>]*>[^<]+</time>[^<]*<span class="ago">\(in [^)]+\)</span></td><td class="renewed secondary"><time datetime="2026-01-02T03:04:05Z"[^>]*>2026-01-02 03:04:05 UTC</time> <span class="ago">\([^)]+ ago\)</span></td><td>5</td>`, body)
		require.Regexp(t, `data-partition="1"><td>1</td><td class="owner">none</td>`, body)
		if path == "/" {
			require.Contains(t, body, `data-refresh="/fragments/overview"`)
		} else {
			require.NotContains(t, body, "<html", "a fragment, not a page")
			requireText(t, body, "outbox-rate", "0.0/s") // nothing published since the page
		}
	}
}

// A payment's journey: its events in version order, each with its outbox
// state, every consumer's outcome and its webhook attempts; found by the
// payment id and by any of its message ids.
func TestJourneyOfAPayment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = console.DefaultPageSize })
	pay := "0190c0de-0000-7000-8000-000000000001"
	v2 := e.insertOutbox(t, pay, 2, true, false) // inserted first: the page orders by version
	v1 := e.insertOutbox(t, pay, 1, true, false)
	v3 := e.insertOutbox(t, pay, 3, false, true)
	e.insertOutbox(t, "another", 1, true, false)
	m1, m2 := e.messageID(t, v1), e.messageID(t, v2)
	e.exec(t, `INSERT INTO processed_messages (message_id, consumer, processed_at) VALUES
		($1, 'notify-merchant', '2026-01-01 00:00:01Z'), ($1, 'analytics', '2026-01-01 00:00:02Z'), ($2, 'notify-merchant', '2026-01-01 00:00:03Z'),
		($2, 'analytics', '2026-01-01 00:00:04Z')`, m1, m2) // rows as consumers wrote them before 00026: a parked message had one too
	e.insertDead(t, "analytics", m2, pay, 2, "dead")
	ep := e.hookEndpoint(t, testAccount, "https://example.com/hook")
	e.hookMessage(t, testAccount, ep, m1, "payment.paid")
	var del int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `UPDATE webhook_endpoint_deliveries SET status = 'delivered', attempts = 2,
		settled_at = now() WHERE message_id = $1 RETURNING id`, m1).Scan(&del))
	e.insertAttempts(t, del, 503, 200)
	e.exec(t, `UPDATE webhook_endpoint_attempts SET latency_ms = 12.5, error = 'upstream down' WHERE status_code = 503`)

	c := e.client(t)
	e.login(t, c)
	for _, q := range []string{pay, m2, e.messageID(t, v3)} {
		res, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q="+url.QueryEscape(q), nil)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, body, `data-aggregate-id="`+pay+`"`, q)
		ids := regexp.MustCompile(`<section class="event" id="event-(\d+)"`).FindAllStringSubmatch(body, -1)
		require.Len(t, ids, 3, q)
		require.Equal(t, []string{strconv.FormatInt(v1, 10), strconv.FormatInt(v2, 10), strconv.FormatInt(v3, 10)},
			[]string{ids[0][1], ids[1][1], ids[2][1]}, "version order")
		sections := strings.Split(body, `<section class="event"`)[1:]
		require.Regexp(t, `(?s)data-consumer="notify-merchant" data-status="processed">.*?<td class="processed-at"><time datetime="2026-01-01T00:00:01Z"[^>]*>2026-01-01 00:00:01 UTC</time>`, sections[0])
		require.Contains(t, sections[0], `data-consumer="analytics" data-status="processed"`)
		require.Contains(t, sections[0], `<td>503</td>`)
		require.Contains(t, sections[0], `12.5 ms`)
		require.Contains(t, sections[0], `upstream down`)
		require.Contains(t, sections[0], `<td>200</td>`)
		require.Contains(t, sections[1], `data-consumer="notify-merchant" data-status="processed"`)
		require.Regexp(t, `data-consumer="analytics" data-status="dead">\s*<td>analytics</td><td class="status">dead</td>`, sections[1])
		require.Contains(t, sections[1], `ledger is closed`)
		require.Regexp(t, `(?s)data-consumer="analytics" data-status="dead">.*?<td class="processed-at"></td>`, sections[1],
			"a dead letter is not shown processed")
		// Parked, not "pending": the forwarder will not send it on its own.
		require.Contains(t, sections[2], `<dd class="published-at">no: parked, the forwarder does not send it until it is retried or discarded</dd>`)
		require.NotContains(t, sections[2], `pending`)
		require.Regexp(t, `<dd class="parked"><time[^>]*>[^<]+</time> <span class="ago">[^<]+</span>: <a href="/parked\?at=`+
			strconv.FormatInt(v3, 10)+`#parked-`+strconv.FormatInt(v3, 10)+`" class="parked-link">`, sections[2])
		require.Contains(t, sections[2], `broker said no`)
		require.Contains(t, sections[2], `data-consumer="analytics" data-status=""`)
	}
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q=nothing-here", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="journey-empty"`)
}

// Consumers keep no row per message: an event is shown processed by a
// consumer once the consumer's version of the aggregate reached it, with no
// time; a row written before migration 00026's release still gives its
// time; an event past the version, or parked, is not processed.
func TestJourneyShowsHandledByTheVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = console.DefaultPageSize })
	pay := "0190c0de-0000-7000-8000-000000000002"
	v1 := e.insertOutbox(t, pay, 1, true, false)
	v2 := e.insertOutbox(t, pay, 2, true, false)
	e.insertOutbox(t, pay, 3, true, false)
	m1, m2 := e.messageID(t, v1), e.messageID(t, v2)
	e.exec(t, `INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version) VALUES
		('notify-merchant', 'payment', $1, 2), ('analytics', 'payment', $1, 1)`, pay)
	e.exec(t, `INSERT INTO processed_messages (message_id, consumer, processed_at) VALUES ($1, 'analytics', '2026-01-01 00:00:02Z')`, m1)
	e.insertDead(t, "analytics", m2, pay, 2, "held")

	c := e.client(t)
	e.login(t, c)
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q="+url.QueryEscape(pay), nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	sections := strings.Split(body, `<section class="event"`)[1:]
	require.Len(t, sections, 3)
	require.Regexp(t, `(?s)data-consumer="notify-merchant" data-status="processed">.*?<td class="processed-at"></td>`, sections[0],
		"handled by the version: no time")
	require.Regexp(t, `(?s)data-consumer="analytics" data-status="processed">.*?<td class="processed-at"><time datetime="2026-01-01T00:00:02Z"[^>]*>2026-01-01 00:00:02 UTC</time>`, sections[0],
		"a row written before the change still gives its time")
	require.Contains(t, sections[1], `data-consumer="notify-merchant" data-status="processed"`)
	require.Contains(t, sections[1], `data-consumer="analytics" data-status="held"`, "parked: its dead letter's status")
	require.Contains(t, sections[2], `data-consumer="notify-merchant" data-status=""`, "past the version: not yet")
	require.Contains(t, sections[2], `data-consumer="analytics" data-status=""`)
}

var (
	indexScanRe     = regexp.MustCompile(`Index (?:Only )?Scan (?:Backward )?(?:using|on) (\w+)`)
	openIndexScanRe = regexp.MustCompile(`Index Scan using dead_letters_open_(?:consumer_)?status_idx `)
	// The partitions' cursors (outbox_state's) are one row a partition:
	// read whole.
	waitingRowsIndexes = map[string]bool{"outbox_partitions_pkey": true, "dead_letters_open_idx": true, "dead_letters_open_consumer_status_idx": true,
		"webhook_endpoint_deliveries_due_healthy_idx": true, "webhook_endpoint_deliveries_due_suspect_idx": true,
		"webhook_endpoint_deliveries_pending_idx": true, "webhook_endpoint_deliveries_failed_idx": true,
		"webhook_endpoint_deliveries_failing_idx": true, "webhook_endpoints_disabled_idx": true, "webhook_endpoints_circuit_idx": true}
)

// pageScanRe matches a scan of an outbox partition's aggregate index
// (outbox_aggregate_version_idx on the first, named after each later one).
var pageScanRe = regexp.MustCompile(`Index Scan (?:Backward )?using (?:outbox_aggregate_version_idx|outbox_\w+_aggregate_type_aggregate_id_aggregate_\w*idx) `)

// planAncestors is the names of the nodes above plan[i] in an EXPLAIN's
// text, nearest first: the nodes whose "->" is less indented, above it.
func planAncestors(plan []string, i int) []string {
	indent := func(line string) (int, bool) {
		rest := strings.TrimLeft(line, " ")
		return len(line) - len(rest), strings.HasPrefix(rest, "->")
	}
	name := func(line string) string {
		rest := strings.TrimPrefix(strings.TrimLeft(line, " "), "->")
		rest = strings.TrimSpace(rest)
		if j := strings.Index(rest, "  ("); j >= 0 {
			rest = rest[:j]
		}
		return rest
	}
	var up []string
	cur, _ := indent(plan[i])
	for j := i - 1; j >= 0; j-- {
		d, node := indent(plan[j])
		if j == 0 || (node && d < cur) {
			up = append(up, name(plan[j]))
			cur = d
		}
	}
	return up
}

// No query of the journey or the lists reads a whole table: with
// sequential scans off, each plan still finds an index (a plan with no
// usable index shows a Seq Scan anyway).
func TestQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	args := map[string][]any{
		"find message":  {"00000000-0000-0000-0000-000000000001"},
		"events after":  {"payment", "p1", 0, 0, 51},
		"events before": {"payment", "p1", 200, 0, 51},
		"processed":     {[]string{"00000000-0000-0000-0000-000000000001"}},
		"dead outcomes": {[]string{"notify-merchant"}, []string{"00000000-0000-0000-0000-000000000001"}},
		"deliveries":    {[]string{"00000000-0000-0000-0000-000000000001"}},
		"parked":        {pgx.NamedArgs{"after": 0, "limit": 50, "topic": "", "error": ""}},
		"webhook stats": nil,
	}
	for name := range console.Queries {
		if strings.Contains(name, "dead letter") {
			args[name] = []any{pgx.NamedArgs{"consumer": "notify-merchant", "error": "boom", "after": 0, "before": 100, "limit": 50,
				"first": 100, "cap": 10001, "window": 1000, "groups": 10}}
		}
	}
	for name, a := range console.SearchQueryArgs { // the search's, and what a held event waits behind
		args[name] = a
	}
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `RESET enable_seqscan`) }()
	explain := func(name, q string) []string {
		rows, err := conn.Query(ctx, "EXPLAIN "+q, args[name]...)
		require.NoError(t, err, name)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		return plan
	}
	require.Len(t, console.Queries, len(args))
	for name, q := range console.Queries {
		plan := explain(name, q)
		text := strings.Join(plan, "\n")
		require.NotContains(t, text, "Seq Scan", "%s:\n%s", name, text)
		// A full index scan filtered row by row would pass the line above:
		// every index scan needs a condition on the index, but for a
		// partial index of the rows that wait (pending outbox rows, open
		// dead letters), whose predicate bounds it.
		scans := 0
		for _, m := range indexScanRe.FindAllStringSubmatch(text, -1) {
			if !waitingRowsIndexes[m[1]] {
				scans++
			}
		}
		require.Positive(t, len(indexScanRe.FindAllString(text, -1)), "%s:\n%s", name, text)
		require.GreaterOrEqual(t, strings.Count(text, "Index Cond"), scans, "%s: an index scan without a condition:\n%s", name, text)
		// A page of the journey reads the aggregate's published rows by a
		// range scan of outbox_aggregate_version_idx that starts at the
		// page's position and that the page's Limit stops: no Sort above
		// it, which would read every published row of the aggregate first.
		// The generic plan too: pgx prepares the query, and PostgreSQL may
		// switch to that plan after a few runs.
		if strings.HasPrefix(name, "events") {
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				_, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode)
				require.NoError(t, err)
				plan := explain(name, q)
				text := strings.Join(plan, "\n")
				var at []int
				for i, line := range plan {
					if pageScanRe.MatchString(line) {
						at = append(at, i)
					}
				}
				require.NotEmpty(t, at, "%s, %s: a scan of the aggregate's rows, per outbox partition:\n%s", name, mode, text)
				for _, i := range at {
					require.Regexp(t, `Index Cond: .*ROW\(aggregate_version, id\) [<>] ROW\(`, plan[i+1],
						"%s, %s: the position bounds the scan:\n%s", name, mode, text)
					up := planAncestors(plan, i)
					// Above the partitions' scans, merged in order, the
					// page's Limit.
					for len(up) > 0 && (up[0] == "Merge Append" || up[0] == "Append") {
						up = up[1:]
					}
					require.NotEmpty(t, up, "%s, %s:\n%s", name, mode, text)
					require.Equal(t, "Limit", up[0], "%s, %s: the page's Limit stops the scan:\n%s", name, mode, text)
					require.NotContains(t, up, "Sort", "%s, %s: no sort of the published rows:\n%s", name, mode, text)
				}
			}
			_, err := conn.Exec(ctx, `RESET plan_cache_mode`)
			require.NoError(t, err)
		}
		// Each status's branch of a dead letters' list is an ordered scan
		// of one of 00020's indexes of open dead letters in id order
		// (which one is the planner's choice: by consumer, or by status
		// with the consumer filtered), never a sort of every open row that
		// matches.
		if strings.HasPrefix(name, "dead letters") {
			branches := strings.Count(console.Queries[name], "ORDER BY id LIMIT")
			if branches > 1 {
				branches-- // the merge's
			}
			require.Len(t, openIndexScanRe.FindAllString(text, -1), branches, "%s:\n%s", name, text)
			require.NotRegexp(t, `Sort  \(`, text, "%s:\n%s", name, text)
		}
	}
}

// Retrying a parked row: the form asks for confirmation first (nothing
// changes), then clears parked_at, records the action and shows its
// result; a forwarder then publishes the row.
func TestRetryParkedRowIsForwarded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.insertOutbox(t, "p1", 1, false, true)
	c := e.client(t)
	csrf := e.login(t, c)

	res, body := do(t, c, http.MethodGet, e.srv.URL+"/parked", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="parked-`+strconv.FormatInt(id, 10)+`"`)

	form := url.Values{"csrf_token": {csrf}, "id": {strconv.FormatInt(id, 10)}}
	res, body = do(t, c, http.MethodPost, e.srv.URL+"/parked/retry", form)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="confirm-form"`)
	require.Contains(t, body, `name="id" value="`+strconv.FormatInt(id, 10)+`"`)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_failures WHERE parked_at IS NOT NULL`), "not before confirmation")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM outflow_operator_actions`))

	form.Set("confirm", "yes")
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/parked/retry", form)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	loc := res.Header.Get("Location")
	require.Regexp(t, `^/parked\?done=\d+$`, loc)
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM outbox_failures WHERE parked_at IS NOT NULL`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE actor_kind = 'console' AND actor_id = $1 AND actor_name = 'ops'
		AND action = 'outbox.retry' AND target = jsonb_build_object('ids', jsonb_build_array($2::bigint)) AND result_count = 1
		AND at > now() - interval '1 minute'`, e.adminID, id))
	res, body = do(t, c, http.MethodGet, e.srv.URL+loc, nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	requireText(t, body, "action-count", "1")

	rc := testservers.Redis(t)
	b, err := redisstreams.New(redisstreams.Config{Client: rc, StreamPrefix: testservers.UniqueName(t, rc)})
	require.NoError(t, err)
	f, err := forwarder.New(forwarder.Config{Pool: e.pool, Broker: b, PollInterval: 20 * time.Millisecond, TakeoverAfter: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	outflowtest.WaitFor(t, 20*time.Second, "the retried row published", func() bool {
		return e.count(t, `SELECT count(*) FROM outbox_state WHERE id = $1 AND published`, id) > 0
	})
	res, body = do(t, c, http.MethodGet, e.srv.URL+"/journey?q="+e.messageID(t, id), nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `<dd class="published-at">by <time`)
}

// Dead letters: retry and discard, one or all of a filter, each recorded
// and listed on /actions.
func TestDeadLetterActionsAreRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.insertDead(t, "notify-merchant", "00000000-0000-0000-0000-000000000001", "a", 1, "dead")
	b := e.insertDead(t, "notify-merchant", "00000000-0000-0000-0000-000000000002", "b", 1, "dead")
	x := e.insertDead(t, "analytics", "00000000-0000-0000-0000-000000000003", "c", 1, "dead")
	y := e.insertDead(t, "analytics", "00000000-0000-0000-0000-000000000004", "d", 1, "dead")
	c := e.client(t)
	csrf := e.login(t, c)

	res, body := do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="dead-`+strconv.FormatInt(x, 10)+`"`)
	require.NotContains(t, body, `id="dead-`+strconv.FormatInt(a, 10)+`"`, "filtered by consumer")

	post := func(path string, form url.Values) string {
		form.Set("csrf_token", csrf)
		form.Set("confirm", "yes")
		res, _ := do(t, c, http.MethodPost, e.srv.URL+path, form)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		return res.Header.Get("Location")
	}
	post("/dead/retry", url.Values{"id": {strconv.FormatInt(a, 10)}})
	post("/dead/discard", url.Values{"id": {strconv.FormatInt(b, 10)}})
	loc := post("/dead/discard", url.Values{"all": {"1"}, "consumer": {"analytics"}})
	require.Regexp(t, `^/dead\?consumer=analytics&done=\d+$`, loc)
	for id, want := range map[int64]string{a: "retrying", b: "discarded", x: "discarded", y: "discarded"} {
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM dead_letters WHERE id = $1 AND status = $2`, id, want), "%d %s", id, want)
	}
	_, body = do(t, c, http.MethodGet, e.srv.URL+loc, nil)
	requireText(t, body, "action-count", "2")

	require.Equal(t, 3, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE actor_id = $1`, e.adminID))
	// PageSize is 2: the newest two, then the oldest on the next page.
	res, body = do(t, c, http.MethodGet, e.srv.URL+"/actions", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, 2, strings.Count(body, `<tr class="action"`))
	require.Contains(t, body, `dlq.discard`)
	m := regexp.MustCompile(`class="next-page" href="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, m)
	_, body = do(t, c, http.MethodGet, e.srv.URL+strings.ReplaceAll(m[1], "&amp;", "&"), nil)
	require.Equal(t, 1, strings.Count(body, `<tr class="action"`))
	require.Contains(t, body, `dlq.retry`)
}

// Replaying one aggregate to one consumer publishes its retained events to
// the consumer's replay topic through the real broker, and is recorded.
func TestReplayOneAggregateToOneConsumer(t *testing.T) {
	t.Parallel()
	rc := testservers.Redis(t)
	b, err := redisstreams.New(redisstreams.Config{Client: rc, StreamPrefix: testservers.UniqueName(t, rc)})
	require.NoError(t, err)
	e := newEnv(t, func(c *console.Config) { c.Broker = b })
	pay := "0190c0de-0000-7000-8000-000000000002"
	e.insertOutbox(t, pay, 1, true, false)
	e.insertOutbox(t, pay, 2, true, false)
	e.insertOutbox(t, "other", 1, true, false)
	c := e.client(t)
	csrf := e.login(t, c)
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q="+pay, nil)
	require.Contains(t, body, `id="replay-form"`)
	// No consumer is chosen for the operator: the form asks, and each
	// choice carries its own question, naming the count and the consumer.
	require.Contains(t, body, `<select name="consumer" id="replay-consumer" required><option value="" selected disabled>choose a consumer</option>`)
	require.Contains(t, body, `<option value="analytics" data-confirm="Replay 2 events of payment `+pay+` to consumer analytics?">analytics (2 events)</option>`)

	form := url.Values{"csrf_token": {csrf}, "consumer": {"analytics"}, "aggregate_type": {"payment"}, "aggregate_id": {pay}}
	res, body := do(t, c, http.MethodPost, e.srv.URL+"/replay", form)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="confirm-form"`)
	require.Contains(t, body, "Replay 2 events of payment "+pay+" to consumer analytics?", "the server's question too")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM outflow_operator_actions`))
	form.Set("confirm", "yes")
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/replay", form)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'replay' AND result_count = 2 AND error = ''
		AND target = jsonb_build_object('consumer', 'analytics', 'aggregate_type', 'payment', 'aggregate_id', $1::text)`, pay))
	_, body = do(t, c, http.MethodGet, e.srv.URL+res.Header.Get("Location"), nil)
	requireText(t, body, "action-count", "2")
	// The journey lists the replay: who, to which consumer, how many
	// events; another aggregate's journey does not.
	require.Regexp(t, `(?s)id="journey-replays".*<tr class="replay" id="replay-\d+" data-consumer="analytics">.*ops.*analytics.*<td class="count" data-label="Events">2</td>`, body)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/journey?q=other", nil)
	require.NotContains(t, body, `id="journey-replays"`)

	form.Set("consumer", "nobody")
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/replay", form)
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "an unknown consumer")
	form.Set("consumer", "")
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/replay", form)
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "no consumer chosen")
}

// Discarding parked rows: confirmed first (the page says what a discard
// does), then recorded and applied to the rows chosen, one or all of the
// topic filter; the /parked list filters by topic, across pages; the
// journey shows the row discarded. Without the CSRF token, or with a bad
// id, nothing changes.
func TestDiscardParkedRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p1 := e.insertOutbox(t, "p1", 1, false, true)
	held := e.insertOutbox(t, "p1", 2, false, false)
	e.exec(t, `INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind) SELECT id, aggregate_type, aggregate_id, 'held'
		FROM outbox WHERE id = $1`, held) // behind p1, as the forwarder holds it
	p2 := e.insertOutbox(t, "p2", 1, false, true)
	p3 := e.insertOutbox(t, "p3", 1, false, true)
	r1 := e.insertOutbox(t, "r1", 1, false, true)
	e.exec(t, `UPDATE outbox SET topic = 'refunds' WHERE id = $1`, r1)
	ids := func(id int64) string { return strconv.FormatInt(id, 10) }
	rowRe := regexp.MustCompile(`id="parked-(\d+)"`)
	listed := func(body string) []string {
		var out []string
		for _, m := range rowRe.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	parked := func() int {
		return e.count(t, `SELECT count(*) FROM outbox_failures WHERE parked_at IS NOT NULL AND discarded_at IS NULL`)
	}
	c := e.client(t)
	csrf := e.login(t, c)

	_, body := do(t, c, http.MethodGet, e.srv.URL+"/parked?topic=refunds", nil)
	require.Equal(t, []string{ids(r1)}, listed(body))
	require.Contains(t, body, `name="topic" value="refunds"`, "the actions carry the filter")
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/parked?topic=payments", nil)
	require.Equal(t, []string{ids(p1), ids(p2)}, listed(body), "a page of 2")
	m := regexp.MustCompile(`class="next-page" href="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, m)
	require.Contains(t, m[1], "topic=payments")
	_, body = do(t, c, http.MethodGet, e.srv.URL+strings.ReplaceAll(m[1], "&amp;", "&"), nil)
	require.Equal(t, []string{ids(p3)}, listed(body), "the next page keeps the filter")

	res, _ := do(t, c, http.MethodPost, e.srv.URL+"/parked/discard", url.Values{"id": {ids(p1)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token")
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/parked/discard", url.Values{"csrf_token": {csrf}, "id": {"abc"}, "confirm": {"yes"}})
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	res, body = do(t, c, http.MethodPost, e.srv.URL+"/parked/discard", url.Values{"csrf_token": {csrf}, "id": {ids(p1)}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="confirm-form"`)
	require.Contains(t, body, "discard marker")
	require.Contains(t, body, "their handler is not run")
	require.Equal(t, 4, parked(), "nothing before confirmation")
	require.Zero(t, e.count(t, `SELECT count(*) FROM outflow_operator_actions`))

	// Chosen ids ignore the list's filter (the form carries it from a
	// filtered page): it is not recorded with them.
	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/parked/discard",
		url.Values{"csrf_token": {csrf}, "id": {ids(p1)}, "topic": {"elsewhere"}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Regexp(t, `^/parked\?done=\d+&topic=elsewhere$`, res.Header.Get("Location"))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_failures WHERE id = $1 AND discarded_at IS NOT NULL AND parked_at IS NULL
		AND next_attempt_at IS NOT NULL`, p1), "discarded and released")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_state WHERE id = $1 AND discarded_at IS NULL AND state = 'held'`, held),
		"the row held behind it still waits for it, untouched (the forwarder sends it after p1)")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE actor_id = $1 AND action = 'outbox.discard'
		AND target = jsonb_build_object('ids', jsonb_build_array($2::bigint)) AND result_count = 1`, e.adminID, p1))

	res, _ = do(t, c, http.MethodPost, e.srv.URL+"/parked/discard",
		url.Values{"csrf_token": {csrf}, "all": {"1"}, "topic": {"refunds"}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	loc := res.Header.Get("Location")
	require.Regexp(t, `^/parked\?done=\d+&topic=refunds$`, loc)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox_failures WHERE id = $1 AND discarded_at IS NOT NULL`, r1))
	require.Equal(t, 2, parked(), "the other topic's rows are still parked")
	// Bound, without a through= from the page, at the newest row of the
	// filter when it acted.
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'outbox.discard'
		AND target = jsonb_build_object('all', true, 'topic', 'refunds', 'through', $1::bigint) AND result_count = 1`, r1))
	_, body = do(t, c, http.MethodGet, e.srv.URL+loc, nil)
	requireText(t, body, "action-count", "1")

	// The journey shows p1 discarded, its marker due. (Once the forwarder
	// published the marker, p1 leaves outbox_failures and, since 00025,
	// the outbox keeps no discarded_at of it: that part is not checked.)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/journey?q=p1", nil)
	sections := strings.Split(body, `<section class="event"`)[1:]
	require.Len(t, sections, 2)
	require.Contains(t, sections[0], `class="discarded-badge"`)
	require.Regexp(t, `<dd class="discarded"><time[^>]*>[^<]+</time> <span class="ago">[^<]+</span>: consumers receive a discard marker`, sections[0])
	require.Contains(t, sections[0], `<dd class="published-at">not yet (failed: the forwarder tries again)</dd>`)
	require.Contains(t, sections[0], `<dd class="state">failed</dd>`)
	require.NotContains(t, sections[1], `discarded`)
	require.Contains(t, sections[1], `<dd class="state">held</dd>`)
}

// A discarded row parked again (its marker failed) is marked so on /parked,
// with when it was discarded, and says a retry sends the marker again: an
// operator must not take it for the event. A row never discarded is not.
func TestParkedListShowsADiscardedRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	again := e.insertOutbox(t, "p1", 1, false, true)
	plain := e.insertOutbox(t, "p2", 1, false, true)
	e.exec(t, `UPDATE outbox_failures SET discarded_at = '2026-01-02 03:04:05.678Z' WHERE id = $1`, again)
	c := e.client(t)
	e.login(t, c)
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/parked", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	rows := regexp.MustCompile(`(?s)<tr class="parked-row[^"]*" id="parked-(\d+)".*?</tr>`).FindAllStringSubmatch(body, -1)
	require.Len(t, rows, 2)
	require.Equal(t, strconv.FormatInt(again, 10), rows[0][1])
	require.Contains(t, rows[0][0], `class="parked-row discarded"`)
	require.Contains(t, rows[0][0], `<span class="discarded-badge">discarded</span>`)
	require.Regexp(t, `<div class="discarded-note">discarded <time datetime="2026-01-02T03:04:05.678Z"[^>]*>2026-01-02 03:04:05 UTC</time> <span class="ago">[^<]+</span>: its discard marker is what failed, `+
		`and a retry sends the marker again, not this event</div>`, rows[0][0])
	require.Equal(t, strconv.FormatInt(plain, 10), rows[1][1])
	require.Contains(t, rows[1][0], `class="parked-row"`)
	require.NotContains(t, rows[1][0], "discard", "a row never discarded")
}
