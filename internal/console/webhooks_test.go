package console_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

var webhookRowRe = regexp.MustCompile(`<tr class="webhook-row" id="webhook-(\d+)" data-status="([a-z]+)"`)

func webhookRows(body string) []string {
	var out []string
	for _, m := range webhookRowRe.FindAllStringSubmatch(body, -1) {
		out = append(out, m[2]+":"+m[1])
	}
	return out
}

// /webhooks lists the failing (pending after a failed attempt) and failed
// deliveries of the framework's webhook tables, across accounts, newest
// first, a page at a time, each with its account, endpoint, last error,
// attempts, next attempt and a link to its event's journey; filtered by
// status and account; a status it does not know, or an account too long,
// is a 400 naming the field.
func TestWebhooksList(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2
	c := e.client(t)
	e.login(t, c)
	f1 := e.insertDelivery(t, "pending", 2, "HTTP 500")
	e.insertDelivery(t, "pending", 0, "")   // waits its first attempt: not failing
	e.insertDelivery(t, "delivered", 1, "") // done
	d1 := e.insertDelivery(t, "failed", 9, "HTTP 410")
	f2 := e.insertDelivery(t, "pending", 1, "connection refused")
	epB := e.hookEndpoint(t, "acct-b", "https://b.example/hooks")
	fb, _ := e.hookDelivery(t, "acct-b", epB, "pending", 3, "HTTP 503")

	res, body := do(t, c, http.MethodGet, e.srv.URL+"/webhooks", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, []string{fmt.Sprint("failing:", fb), fmt.Sprint("failing:", f2)}, webhookRows(body), "newest first")
	require.Contains(t, body, `<td class="error">HTTP 503</td>`)
	require.Contains(t, body, `<a href="/webhooks/accounts/acct-b" class="account-link"><code>acct-b</code></a>`, "the account")
	require.Contains(t, body, `<a href="/webhooks/endpoints/`+epB+`" class="endpoint-link"><code>https://b.example/hooks</code></a>`)
	require.Regexp(t, `id="webhook-`+fmt.Sprint(f2)+`"(?s:.*?)<time datetime=`, body, "a failing one's next attempt")
	// Paged as the other lists: a total, First, Previous, Next.
	require.Contains(t, body, `<span class="showing">Showing 1–2 of 4</span>`)
	require.Contains(t, body, fmt.Sprintf(`<a class="next-page" href="/webhooks?after=%d">Next</a>`, f2), "a next page")
	require.NotContains(t, body, `class="first-page"`, "the first page")
	require.NotContains(t, body, `class="prev-page"`, "the first page")

	res, body = do(t, c, http.MethodGet, e.srv.URL+fmt.Sprintf("/webhooks?after=%d", f2), nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, []string{fmt.Sprint("failed:", d1), fmt.Sprint("failing:", f1)}, webhookRows(body))
	require.Contains(t, body, `<span class="showing">Showing 3–4 of 4</span>`)
	require.Contains(t, body, `none (failed)`, "a failed delivery has no next attempt")
	var mid string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT message_id::text FROM webhook_endpoint_deliveries WHERE id = $1`, d1).Scan(&mid))
	require.Contains(t, body, `<a href="/journey?q=`+mid+`" class="journey-link">payment.paid</a>`)
	require.NotContains(t, body, `class="next-page"`)
	require.Contains(t, body, `<a class="first-page" href="/webhooks">First</a>`)
	require.Contains(t, body, fmt.Sprintf(`<a class="prev-page" href="/webhooks?before=%d">Previous</a>`, d1))

	res, body = do(t, c, http.MethodGet, e.srv.URL+fmt.Sprintf("/webhooks?before=%d", d1), nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, []string{fmt.Sprint("failing:", fb), fmt.Sprint("failing:", f2)}, webhookRows(body), "Previous: the first page again")
	require.Contains(t, body, `<span class="showing">Showing 1–2 of 4</span>`)
	res, _ = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?after=x", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "a position that is no row id")

	_, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?status=failing&account="+testAccount, nil)
	require.Equal(t, []string{fmt.Sprint("failing:", f2), fmt.Sprint("failing:", f1)}, webhookRows(body))
	require.Contains(t, body, `<span class="showing">Showing 1–2 of 2</span>`)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?account=acct-b", nil)
	require.Equal(t, []string{fmt.Sprint("failing:", fb)}, webhookRows(body))
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?account=nobody", nil)
	require.Empty(t, webhookRows(body))
	require.Contains(t, body, `id="webhooks-empty"`)
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?status=failed", nil)
	require.Equal(t, []string{fmt.Sprint("failed:", d1)}, webhookRows(body))

	res, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?status=delivered", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Contains(t, body, "status must be empty or one of failing, failed")
	res, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?account="+strings.Repeat("a", 201), nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Contains(t, body, "account must be at most 200 bytes")

	// The overview's counts link here.
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Contains(t, body, `<a href="/webhooks?status=failing" class="warn">3</a>`)
	require.Contains(t, body, `<a href="/webhooks?status=failed" class="bad">1</a>`)
	require.Contains(t, body, `<a href="/webhooks" id="nav-webhooks">Webhooks</a>`)
}

// The list's queries read indexes, never the whole table: each status
// through its partial index in id order, never the primary key's walk of
// every delivery.
func TestWebhooksListUsesIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ep := e.hookEndpoint(t, testAccount, "https://merchant.example/hooks")
	// Enough delivered rows that reading them would show.
	e.exec(t, `WITH m AS (
		    INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, payload)
		    SELECT gen_random_uuid(), $2, 'payment.paid', now(), '{}' FROM generate_series(1, 5000) RETURNING id
		)
		INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, attempts, settled_at)
		SELECT id, $1, 'delivered', 1, now() FROM m`, ep, testAccount)
	e.exec(t, `ANALYZE webhook_endpoint_deliveries`)
	e.exec(t, `ANALYZE webhook_endpoints`)
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// The endpoints are a handful here: off, a plan that reads them
	// whole shows.
	_, err = conn.Exec(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `RESET enable_seqscan`) }()
	require.NotEmpty(t, console.WebhookQueries)
	for name, q := range console.WebhookQueries {
		rows, err := conn.Query(ctx, "EXPLAIN "+q, pgx.NamedArgs{"after": 4000, "before": 4000, "first": 4000, "limit": 51,
			"cap": console.CountCap + 1, "account": testAccount})
		require.NoError(t, err, name)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		text := strings.Join(plan, "\n")
		require.NotContains(t, text, "Seq Scan", "%s:\n%s", name, text)
		require.NotContains(t, text, "webhook_endpoint_deliveries_pkey", "%s: a walk of every delivery:\n%s", name, text)
		if strings.HasPrefix(name, "failed") || strings.HasPrefix(name, "failing and failed") {
			require.Contains(t, text, "webhook_endpoint_deliveries_failed_idx", "%s:\n%s", name, text)
		}
		if strings.HasPrefix(name, "failing") {
			require.Contains(t, text, "webhook_endpoint_deliveries_failing_idx", "%s:\n%s", name, text)
		}
	}
}
