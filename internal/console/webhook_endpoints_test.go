package console_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/webhooks"
)

// An endpoint's page: its settings (never its secret), its health (failing
// since, consecutive failures, circuit), its messages newest first a page
// at a time, and one message's attempts with the merchant's response body
// escaped. An account's page lists its endpoints. Bad ids are 4xx naming
// the field.
func TestWebhookEndpointPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // PageSize 2
	c := e.client(t)
	e.login(t, c)
	ep := e.hookEndpoint(t, testAccount, "https://merchant.example/hooks")
	e.exec(t, `UPDATE webhook_endpoints SET failing_since = now() - interval '1 hour', consecutive_failures = 7,
		circuit_open_until = now() + interval '5 minutes' WHERE id = $1`, ep)
	d1, m1 := e.hookDelivery(t, testAccount, ep, "failed", 2, "HTTP 500")
	e.insertAttempts(t, d1, 500, 0)
	e.exec(t, `UPDATE webhook_endpoint_attempts SET response_body = '<script>alert(1)</script> token=***' WHERE status_code = 500`)
	_, m2 := e.hookDelivery(t, testAccount, ep, "delivered", 1, "")
	_, m3 := e.hookDelivery(t, testAccount, ep, "pending", 0, "")
	var secret string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT secret FROM webhook_endpoints WHERE id = $1`, ep).Scan(&secret))

	base := e.srv.URL + "/webhooks/endpoints/" + ep
	res, body := do(t, c, http.MethodGet, base, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.NotContains(t, body, secret, "never the secret")
	requireText(t, body, "endpoint-description", "orders")
	require.Contains(t, body, `<dd id="endpoint-url"><code>https://merchant.example/hooks</code></dd>`)
	require.Contains(t, body, `<a href="/webhooks/accounts/acct-a"><code>acct-a</code></a>`)
	require.Contains(t, body, `data-state="circuit-open">circuit open</span>`)
	requireText(t, body, "endpoint-consecutive-failures", "7")
	require.Regexp(t, `id="endpoint-circuit">open until <time`, body)
	require.Regexp(t, `id="endpoint-failing-since"><time`, body)
	require.Contains(t, body, `id="endpoint-disable"`, "enabled: it can be disabled")
	require.Contains(t, body, `data-message-id="`+m3+`"`, "newest first")
	require.Contains(t, body, `data-message-id="`+m2+`"`)
	require.NotContains(t, body, `data-message-id="`+m1+`"`, "on the next page")
	require.Contains(t, body, `class="next-page"`)
	older := regexpFind(t, body, `<a class="next-page" href="([^"]+)">Older</a>`)
	res, body = do(t, c, http.MethodGet, e.srv.URL+strings.ReplaceAll(older, "&amp;", "&"), nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `data-message-id="`+m1+`"`)
	require.Contains(t, body, `class="first-page"`)
	_, body = do(t, c, http.MethodGet, base+"?status=failed", nil)
	require.Contains(t, body, `data-message-id="`+m1+`"`)
	require.NotContains(t, body, `data-message-id="`+m3+`"`)

	// One message's attempts: the response body is the merchant's text.
	res, body = do(t, c, http.MethodGet, base+"?message="+m1, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `<td class="status-code">500</td>`)
	require.Contains(t, body, `<td class="status-code">-</td>`, "a network error has no status")
	require.Contains(t, body, `connection refused`)
	require.Contains(t, body, `12.0 ms`)
	require.Contains(t, body, `&lt;script&gt;alert(1)&lt;/script&gt; token=***`)
	require.NotContains(t, body, `<script>alert(1)`)
	require.Contains(t, body, `<a href="/journey?q=`+m1+`" class="journey-link">`)
	require.Contains(t, body, `id="message-resend"`)

	for _, bad := range []struct{ path, want string }{
		{"/webhooks/endpoints/not-a-uuid", "endpoint:"},
		{"/webhooks/endpoints/" + uuid.NewString(), "endpoint: no endpoint"},
		{"/webhooks/endpoints/" + ep + "?message=x", "message:"},
		{"/webhooks/endpoints/" + ep + "?message=" + uuid.NewString(), "message: no delivery"},
		{"/webhooks/endpoints/" + ep + "?status=dead", "status:"},
		{"/webhooks/endpoints/" + ep + "?before=x", "before:"},
		{"/webhooks/accounts/nobody", "account: no webhook endpoint"},
	} {
		res, body := do(t, c, http.MethodGet, e.srv.URL+bad.path, nil)
		require.True(t, res.StatusCode == http.StatusBadRequest || res.StatusCode == http.StatusNotFound, "%s: %d", bad.path, res.StatusCode)
		require.Contains(t, body, bad.want, bad.path)
	}

	other := e.hookEndpoint(t, testAccount, "https://merchant.example/other")
	e.exec(t, `UPDATE webhook_endpoints SET disabled_at = now(), disabled_reason = 'manual' WHERE id = $1`, other)
	res, body = do(t, c, http.MethodGet, e.srv.URL+"/webhooks/accounts/"+testAccount, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `<a href="/webhooks/endpoints/`+ep+`" class="endpoint-link"><code>https://merchant.example/hooks</code></a>`)
	require.Contains(t, body, `data-state="disabled">disabled (manual)</span>`)
	require.Contains(t, body, `<a href="/webhooks?account=acct-a" id="account-deliveries">`)
}

func regexpFind(t *testing.T, body, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(body)
	require.NotNil(t, m, re)
	return m[1]
}

// actions counts the recorded actions named name.
func (e *env) actions(t *testing.T, name string) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = $1`, name)
}

// Each endpoint action asks first and changes nothing; confirmed, it
// calls the webhooks packages in one transaction with its record in
// outflow_operator_actions (who, what endpoint of what account, how many)
// and returns to the endpoint's page, which shows it; a refusal of the
// package (a disabled endpoint) is recorded with its error. No CSRF token,
// bad ids and a bad since are refused, naming the field, and change and
// record nothing.
func TestWebhookEndpointActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t)
	csrf := e.login(t, cl)
	ep := e.hookEndpoint(t, testAccount, "https://merchant.example/hooks")
	d1, m1 := e.hookDelivery(t, testAccount, ep, "failed", 9, "HTTP 500")
	d2, _ := e.hookDelivery(t, testAccount, ep, "failed", 9, "HTTP 500")
	d3, _ := e.hookDelivery(t, testAccount, ep, "failed", 9, "HTTP 500")
	e.exec(t, `UPDATE webhook_endpoint_deliveries SET created_at = now() - interval '3 hours' WHERE id = $1`, d3)
	base := e.srv.URL + "/webhooks/endpoints/" + ep
	status := func(id int64) string {
		var s string
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT status || ':' || attempts FROM webhook_endpoint_deliveries WHERE id = $1`, id).Scan(&s))
		return s
	}
	post := func(action string, form url.Values) (*http.Response, string) {
		t.Helper()
		if form == nil {
			form = url.Values{}
		}
		if _, ok := form["csrf_token"]; !ok {
			form.Set("csrf_token", csrf)
		}
		return do(t, cl, http.MethodPost, base+"/"+action, form)
	}
	confirmed := func(action string, form url.Values) string {
		t.Helper()
		res, body := post(action, form)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `id="confirm-question"`)
		require.Contains(t, body, "https://merchant.example/hooks")
		form.Set("confirm", "yes")
		res, body = post(action, form)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		loc := res.Header.Get("Location")
		require.True(t, strings.HasPrefix(loc, "/webhooks/endpoints/"+ep), loc)
		res, body = do(t, cl, http.MethodGet, e.srv.URL+loc, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `id="action-result"`)
		return body
	}
	recorded := func(action, target string, n int) {
		t.Helper()
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = $1 AND actor_kind = 'console'
			AND actor_id = $2 AND target @> $3::jsonb AND result_count = $4`, action, e.adminID, target, n), action)
	}
	who := fmt.Sprintf(`{"account_id": %q, "endpoint_id": %q}`, testAccount, ep)

	// Resend: asked first, nothing changed.
	res, body := post("resend", url.Values{"message": {m1}})
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "Resend the message")
	require.Equal(t, "failed:9", status(d1), "asked, not done")
	require.Zero(t, e.actions(t, "webhook.resend"))
	res, _ = post("resend", url.Values{"message": {m1}, "confirm": {"yes"}, "csrf_token": {""}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, "no CSRF token")
	require.Equal(t, "failed:9", status(d1))
	confirmed("resend", url.Values{"message": {m1}})
	require.Equal(t, "pending:0", status(d1), "resent: schedule restarted")
	recorded("webhook.resend", fmt.Sprintf(`{"account_id": %q, "endpoint_id": %q, "message_id": %q}`, testAccount, ep, m1), 1)

	// Recover: the failed since the time given, not those before.
	since := time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04")
	confirmed("recover", url.Values{"since": {since}})
	require.Equal(t, "pending:0", status(d2))
	require.Equal(t, "failed:9", status(d3), "failed before since")
	recorded("webhook.recover", who, 1)

	// A test event: a message of its own to this endpoint.
	confirmed("test", url.Values{})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM webhook_messages m JOIN webhook_endpoint_deliveries d ON d.message_id = m.id
		WHERE m.event_type = $1 AND d.endpoint_id = $2 AND d.status = 'pending'`, webhooks.EventTest, ep))
	recorded("webhook.test", who, 1)

	// Disable fails the pending deliveries; a resend is then refused by
	// the package, recorded with its error and shown.
	body = confirmed("disable", url.Values{})
	require.Contains(t, body, `id="endpoint-enable"`)
	require.Equal(t, "failed:0", status(d1), "disabled: its pending deliveries failed")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND disabled_reason = 'manual'`, ep))
	recorded("webhook.disable", who, 1)
	body = confirmed("resend", url.Values{"message": {m1}})
	require.Contains(t, body, "error: endpoint disabled")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'webhook.resend' AND error = 'endpoint disabled'`))
	require.Equal(t, "failed:0", status(d1))

	confirmed("enable", url.Values{})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND disabled_at IS NULL`, ep))
	recorded("webhook.enable", who, 1)

	// Bad input: refused before anything, naming the field.
	before := e.count(t, `SELECT count(*) FROM outflow_operator_actions`)
	for _, bad := range []struct {
		path string
		form url.Values
		code int
		want string
	}{
		{"/webhooks/endpoints/not-a-uuid/disable", url.Values{"confirm": {"yes"}}, http.StatusBadRequest, "endpoint:"},
		{"/webhooks/endpoints/" + uuid.NewString() + "/disable", url.Values{"confirm": {"yes"}}, http.StatusNotFound, "endpoint:"},
		{"/webhooks/endpoints/" + ep + "/resend", url.Values{"confirm": {"yes"}, "message": {"x"}}, http.StatusBadRequest, "message:"},
		{"/webhooks/endpoints/" + ep + "/resend", url.Values{"confirm": {"yes"}, "message": {uuid.NewString()}}, http.StatusNotFound, "message:"},
		{"/webhooks/endpoints/" + ep + "/recover", url.Values{"confirm": {"yes"}, "since": {"yesterday"}}, http.StatusBadRequest, "since:"},
		{"/webhooks/endpoints/" + ep + "/recover", url.Values{"confirm": {"yes"}}, http.StatusBadRequest, "since:"},
		{"/webhooks/endpoints/" + ep + "/recover", url.Values{"confirm": {"yes"}, "since": {time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}},
			http.StatusBadRequest, "since: must not be in the future"},
	} {
		bad.form.Set("csrf_token", csrf)
		res, body := do(t, cl, http.MethodPost, e.srv.URL+bad.path, bad.form)
		require.Equal(t, bad.code, res.StatusCode, "%s %v: %s", bad.path, bad.form, body)
		require.Contains(t, body, bad.want, bad.path)
	}
	require.Equal(t, before, e.count(t, `SELECT count(*) FROM outflow_operator_actions`), "nothing recorded")
	require.Equal(t, "failed:9", status(d3), "nothing recovered")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM webhook_endpoints WHERE disabled_at IS NULL`))

	// The Actions page links the endpoint and the message.
	res, body = do(t, cl, http.MethodGet, e.srv.URL+"/actions?action=webhook.resend", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `href="/webhooks/endpoints/`+ep+`"`)
	require.Contains(t, body, `href="/webhooks/endpoints/`+ep+`?message=`+m1+`"`)
}

// A service of a user's own (FrameworkOnly) that installed the webhooks
// set sees and acts on them: the overview's counts, the list, an
// endpoint's page, an action recorded as the operator key's.
func TestFrameworkOnlyWebhooks(t *testing.T) {
	t.Parallel()
	s := userSchema(t)
	installWebhooks(t, s)
	const key = "operator-key-of-the-refunds-service-0123456789"
	sum := sha256.Sum256([]byte(key))
	c, err := console.New(console.Config{Pool: s.Pool, InsecureCookie: true, FrameworkOnly: true, OperatorKeySHA256: sum[:],
		AggregateType: "refund"})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	e := &env{pool: s.Pool, srv: srv, adminKey: key}
	ep := e.hookEndpoint(t, "shop-1", "https://shop.example/hooks")
	d, _ := e.hookDelivery(t, "shop-1", ep, "failed", 9, "HTTP 410")
	cl := e.client(t)
	csrf := e.login(t, cl)
	for page, want := range map[string]string{
		"/":                         `id="webhooks-failed"><a href="/webhooks?status=failed" class="bad">1</a>`,
		"/webhooks":                 fmt.Sprintf(`id="webhook-%d" data-status="failed"`, d),
		"/webhooks/endpoints/" + ep: "https://shop.example/hooks",
		"/webhooks/accounts/shop-1": `class="endpoint-link"`,
	} {
		res, body := do(t, cl, http.MethodGet, srv.URL+page, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", page, body)
		require.Contains(t, body, want, page)
		require.NotContains(t, body, "webhooks-not-installed", page)
	}
	res, body := do(t, cl, http.MethodPost, srv.URL+"/webhooks/endpoints/"+ep+"/disable", url.Values{"csrf_token": {csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE action = 'webhook.disable' AND actor_id = 'operator-key'
		AND target->>'endpoint_id' = $1 AND result_count = 1`, ep))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM webhook_endpoints WHERE disabled_at IS NOT NULL`))
}
