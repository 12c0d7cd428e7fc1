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

// /webhooks lists the failing (pending after a failed attempt) and dead
// deliveries, in id order, a page at a time, each with its last error,
// attempts, next attempt and a link to its event's journey; filtered by
// status; a status it does not know is a 400 naming the field.
func TestWebhooksList(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2
	c := e.client(t)
	e.login(t, c)
	e.exec(t, `INSERT INTO merchants (id, name, webhook_url, webhook_secret) VALUES ('00000000-0000-0000-0000-00000000000a', 'm', 'https://merchant.example/hooks', 's')`)
	f1 := e.insertDelivery(t, "pending", 2, "HTTP 500")
	e.insertDelivery(t, "pending", 0, "")   // waits its first attempt: not failing
	e.insertDelivery(t, "delivered", 1, "") // done
	d1 := e.insertDelivery(t, "dead", 9, "HTTP 410")
	f2 := e.insertDelivery(t, "pending", 1, "connection refused")

	res, body := do(t, c, http.MethodGet, e.srv.URL+"/webhooks", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, []string{fmt.Sprint("failing:", f1), fmt.Sprint("dead:", d1)}, webhookRows(body))
	require.Contains(t, body, `<td class="error">HTTP 500</td>`)
	require.Contains(t, body, `00000000-0000-0000-0000-00000000000a`, "the merchant")
	require.Contains(t, body, `https://merchant.example/hooks`)
	require.Contains(t, body, `none (dead)`, "a dead delivery has no next attempt")
	require.Regexp(t, `id="webhook-`+fmt.Sprint(f1)+`"(?s:.*?)<time datetime=`, body, "a failing one's next attempt")
	var mid string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT message_id::text FROM webhook_deliveries WHERE id = $1`, d1).Scan(&mid))
	require.Contains(t, body, `<a href="/journey?q=`+mid+`" class="journey-link">payment.paid</a>`)
	// Paged as the other lists: a total, First, Previous, Next.
	require.Contains(t, body, `<span class="showing">Showing 1–2 of 3</span>`)
	require.Contains(t, body, fmt.Sprintf(`<a class="next-page" href="/webhooks?after=%d">Next</a>`, d1), "a next page")
	require.NotContains(t, body, `class="first-page"`, "the first page")
	require.NotContains(t, body, `class="prev-page"`, "the first page")

	res, body = do(t, c, http.MethodGet, e.srv.URL+fmt.Sprintf("/webhooks?after=%d", d1), nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, []string{fmt.Sprint("failing:", f2)}, webhookRows(body))
	require.Contains(t, body, `<span class="showing">Showing 3–3 of 3</span>`)
	require.NotContains(t, body, `class="next-page"`)
	require.Contains(t, body, `<a class="first-page" href="/webhooks">First</a>`)
	require.Contains(t, body, fmt.Sprintf(`<a class="prev-page" href="/webhooks?before=%d">Previous</a>`, f2))

	res, body = do(t, c, http.MethodGet, e.srv.URL+fmt.Sprintf("/webhooks?before=%d", f2), nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, []string{fmt.Sprint("failing:", f1), fmt.Sprint("dead:", d1)}, webhookRows(body), "Previous: the first page again")
	require.Contains(t, body, `<span class="showing">Showing 1–2 of 3</span>`)
	res, _ = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?after=x", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "a position that is no row id")

	_, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?status=failing", nil)
	require.Equal(t, []string{fmt.Sprint("failing:", f1), fmt.Sprint("failing:", f2)}, webhookRows(body))
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?status=dead", nil)
	require.Equal(t, []string{fmt.Sprint("dead:", d1)}, webhookRows(body))

	res, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks?status=delivered", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Contains(t, body, "status must be empty or one of failing, dead")

	// The overview's counts link here.
	_, body = do(t, c, http.MethodGet, e.srv.URL+"/", nil)
	require.Contains(t, body, `<a href="/webhooks?status=failing" class="warn">2</a>`)
	require.Contains(t, body, `<a href="/webhooks?status=dead" class="bad">1</a>`)
	require.Contains(t, body, `<a href="/webhooks" id="nav-webhooks">Webhooks</a>`)
}

// The list's queries read indexes, never the whole table: the dead through
// their index in id order, the failing through the pending deliveries'.
func TestWebhooksListUsesIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// Enough delivered rows that reading them would show.
	e.exec(t, `INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, status, attempts)
		SELECT gen_random_uuid(), gen_random_uuid(), 'https://x', 'payment.paid', '', 'delivered', 1 FROM generate_series(1, 5000)`)
	e.exec(t, `ANALYZE webhook_deliveries`)
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for name, q := range console.WebhookQueries {
		rows, err := conn.Query(ctx, "EXPLAIN "+q, pgx.NamedArgs{"after": 0, "before": 4000, "first": 4000, "limit": 51, "cap": console.CountCap + 1})
		require.NoError(t, err, name)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		text := strings.Join(plan, "\n")
		require.NotContains(t, text, "Seq Scan", "%s:\n%s", name, text)
		require.NotContains(t, text, "webhook_deliveries_pkey", "%s: a walk of every delivery:\n%s", name, text)
		if strings.Contains(name, "dead") {
			require.Contains(t, text, "webhook_deliveries_dead_idx", "%s:\n%s", name, text)
		}
		if strings.Contains(name, "failing") {
			require.Contains(t, text, "webhook_deliveries_due_idx", "%s:\n%s", name, text)
		}
	}
}
