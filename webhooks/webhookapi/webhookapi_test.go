package webhookapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/schema"
	"github.com/outflow-dev/outflow/webhooks/webhookapi"
)

const hook = "https://hooks.example.com/in"

type env struct {
	t     *testing.T
	mux   *http.ServeMux
	pool  *pgxpool.Pool
	store *endpoints.Store
	wakes atomic.Int32
	now   time.Time
}

// newEnv mounts the API under /accounts/{account}; a request's caller is
// its X-Account header, which may act on that account only.
func newEnv(t *testing.T, cfg webhookapi.Config) *env {
	t.Helper()
	s := outflowtest.NewSchema(t, schema.Set())
	store, err := endpoints.New(endpoints.Config{MaxPerAccount: 3, APIVersion: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, mux: http.NewServeMux(), pool: s.Pool, store: store, now: time.Now()}
	cfg.Endpoints, cfg.Pool = store, s.Pool
	cfg.Authorize = func(r *http.Request, account string) bool { return r.Header.Get("X-Account") == account }
	cfg.Wake = func() { e.wakes.Add(1) }
	cfg.Now = func() time.Time { return e.now }
	api, err := webhookapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	api.Mount(e.mux, "/accounts/{account}/")
	return e
}

type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// do sends a request as caller to account's path.
func (e *env) do(caller, method, path, body string) response {
	e.t.Helper()
	var r *http.Request
	if body == "" {
		r = httptest.NewRequest(method, path, nil)
	} else {
		r = httptest.NewRequest(method, path, strings.NewReader(body))
	}
	r.Header.Set("X-Account", caller)
	w := httptest.NewRecorder()
	e.mux.ServeHTTP(w, r)
	out := response{status: w.Code, header: w.Header(), raw: w.Body.String()}
	if w.Body.Len() > 0 {
		if err := json.Unmarshal(w.Body.Bytes(), &out.body); err != nil {
			e.t.Fatalf("%s %s: body %q: %v", method, path, w.Body.String(), err)
		}
	}
	return out
}

func (e *env) create(account, body string) map[string]any {
	e.t.Helper()
	res := e.do(account, "POST", "/accounts/"+account+"/webhook_endpoints", body)
	if res.status != http.StatusCreated {
		e.t.Fatalf("create: %d %s", res.status, res.raw)
	}
	return res.body
}

// snapshot is every endpoint row, secrets included: what bad input must
// not change.
func (e *env) snapshot() string {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(json_agg(w ORDER BY id)::text, '[]') FROM webhook_endpoints w`).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

func TestEndpointRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhookapi.Config{})
	c := e.create("acct", `{"url":"`+hook+`","description":"orders","event_types":["payment.*"],"rate_limit":5}`)
	id, _ := c["id"].(string)
	if !strings.HasPrefix(c["secret"].(string), "whsec_") || c["api_version"] != "v1" || c["rate_limit"] != 5.0 || c["account_id"] != "acct" {
		t.Fatalf("created: %v", c)
	}
	base := "/accounts/acct/webhook_endpoints/" + id

	list := e.do("acct", "GET", "/accounts/acct/webhook_endpoints", "")
	if data, _ := list.body["data"].([]any); list.status != 200 || len(data) != 1 || strings.Contains(list.raw, "whsec_") {
		t.Fatalf("list: %d %s", list.status, list.raw)
	}
	got := e.do("acct", "GET", base, "")
	if got.status != 200 || got.body["id"] != id || got.body["description"] != "orders" || strings.Contains(got.raw, "secret") {
		t.Fatalf("get: %d %s", got.status, got.raw)
	}

	up := e.do("acct", "PATCH", base, `{"description":"refunds","rate_limit":null}`)
	if up.status != 200 || up.body["description"] != "refunds" || up.body["rate_limit"] != nil || up.body["url"] != hook {
		t.Fatalf("patch: %d %s", up.status, up.raw)
	}
	up = e.do("acct", "PATCH", base, `{"event_types":[],"rate_limit":9,"url":"`+hook+`/2"}`)
	if up.status != 200 || up.body["rate_limit"] != 9.0 || up.body["url"] != hook+"/2" || len(up.body["event_types"].([]any)) != 0 {
		t.Fatalf("patch: %d %s", up.status, up.raw)
	}

	dis := e.do("acct", "POST", base+"/disable", "")
	if dis.status != 200 || dis.body["disabled"] != true || dis.body["disabled_reason"] != "manual" {
		t.Fatalf("disable: %d %s", dis.status, dis.raw)
	}
	if e.wakes.Load() != 0 {
		t.Fatal("disable woke the sender")
	}
	en := e.do("acct", "POST", base+"/enable", "{}")
	if en.status != 200 || en.body["disabled"] != false {
		t.Fatalf("enable: %d %s", en.status, en.raw)
	}
	if e.wakes.Load() != 1 {
		t.Fatalf("enable woke the sender %d times, want 1", e.wakes.Load())
	}

	rot := e.do("acct", "POST", base+"/secret/rotate", "")
	if rot.status != 200 || rot.body["endpoint_id"] != id || !strings.HasPrefix(rot.body["secret"].(string), "whsec_") ||
		rot.body["secret"] == c["secret"] || rot.body["previous_secret_expires_at"] == nil {
		t.Fatalf("rotate: %d %s", rot.status, rot.raw)
	}

	del := e.do("acct", "DELETE", base, "")
	if del.status != 200 || del.body["id"] != id || del.body["deleted"] != true {
		t.Fatalf("delete: %d %s", del.status, del.raw)
	}
	if res := e.do("acct", "GET", base, ""); res.status != 404 || errorCode(res) != "not_found" {
		t.Fatalf("get after delete: %d %s", res.status, res.raw)
	}
	if res := e.do("acct", "POST", base+"/enable", ""); res.status != 404 || e.wakes.Load() != 1 {
		t.Fatalf("enable of a deleted endpoint: %d %s, %d wakes", res.status, res.raw, e.wakes.Load())
	}
}

func errorCode(r response) string {
	m, _ := r.body["error"].(map[string]any)
	s, _ := m["code"].(string)
	return s
}

func errorField(r response) string {
	m, _ := r.body["error"].(map[string]any)
	s, _ := m["field"].(string)
	return s
}

// Each route's bad input: the status, the code, the field named, and
// nothing changed.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhookapi.Config{})
	c := e.create("acct", `{"url":"`+hook+`","rate_limit":5}`)
	e.create("acct", `{"url":"`+hook+`"}`)
	base := "/accounts/acct/webhook_endpoints/" + c["id"].(string)
	coll := "/accounts/acct/webhook_endpoints"
	recent := e.now.Add(-time.Hour).Format(time.RFC3339)
	tests := []struct {
		method, path, body string
		status             int
		code, field        string
	}{
		{"POST", coll, "", 400, "invalid_json", ""},
		{"POST", coll, `{"url":`, 400, "invalid_json", ""},
		{"POST", coll, `[]`, 400, "invalid_json", ""},
		{"POST", coll, `{"url":"` + hook + `"} {}`, 400, "invalid_json", ""},
		{"POST", coll, `{"url":"` + hook + `","secret":"whsec_mine"}`, 400, "unknown_field", "secret"},
		{"POST", coll, `{"URL":"` + hook + `"}`, 400, "unknown_field", "URL"},
		{"POST", coll, `{"url":"` + hook + `","url":"` + hook + `"}`, 400, "duplicate_field", "url"},
		{"POST", coll, `{"url":1}`, 400, "invalid_type", "url"},
		{"POST", coll, `{"url":"` + hook + `","event_types":"a.b"}`, 400, "invalid_type", "event_types"},
		{"POST", coll, `{"url":"` + hook + `","rate_limit":1.5}`, 400, "invalid_type", "rate_limit"},
		{"POST", coll, `{"url":"` + hook + `","description":"\ud800"}`, 400, "invalid_utf8", ""},
		{"POST", coll, `{}`, 422, "invalid_field", "url"},
		{"POST", coll, `{"url":"https://127.0.0.1/"}`, 422, "invalid_field", "url"},
		{"POST", coll, `{"url":"` + hook + `","description":"a\u0000b"}`, 422, "invalid_field", "description"},
		{"POST", coll, `{"url":"` + hook + `","event_types":["A"]}`, 422, "invalid_field", "event_types"},
		{"POST", coll, `{"url":"` + hook + `","rate_limit":0}`, 422, "invalid_field", "rate_limit"},
		{"POST", coll + "?x=1", "", 400, "invalid_json", ""},
		{"GET", coll + "?limit=5", "", 400, "unknown_field", "limit"},
		{"PUT", coll, "", 405, "method_not_allowed", ""},
		{"PATCH", base, "", 400, "invalid_json", ""},
		{"PATCH", base, `{"url":null}`, 422, "invalid_field", "url"},
		{"PATCH", base, `{"description":null}`, 422, "invalid_field", "description"},
		{"PATCH", base, `{"event_types":null}`, 422, "invalid_field", "event_types"},
		{"PATCH", base, `{"rate_limit":"fast"}`, 400, "invalid_type", "rate_limit"},
		{"PATCH", base, `{"rate_limit":10001}`, 422, "invalid_field", "rate_limit"},
		{"PATCH", base, `{"url":"http://hooks.example.com/"}`, 422, "invalid_field", "url"},
		{"PATCH", base, `{"disabled":true}`, 400, "unknown_field", "disabled"},
		{"PATCH", base, `{"description":"x","Description":"y"}`, 400, "duplicate_field", "Description"},
		{"GET", base + "?expand=1", "", 400, "unknown_field", "expand"},
		{"POST", base, "", 405, "method_not_allowed", ""},
		{"DELETE", base, `{"force":true}`, 400, "unknown_field", "force"},
		{"POST", base + "/disable", `{"reason":"x"}`, 400, "unknown_field", "reason"},
		{"GET", base + "/disable", "", 405, "method_not_allowed", ""},
		{"POST", base + "/enable", `[1]`, 400, "invalid_json", ""},
		{"POST", base + "/secret/rotate", `{"grace":0}`, 400, "unknown_field", "grace"},
		{"GET", base + "/messages?limit=abc", "", 422, "invalid_field", "limit"},
		{"GET", base + "/messages?limit=0", "", 422, "invalid_field", "limit"},
		{"GET", base + "/messages?before=x", "", 422, "invalid_field", "before"},
		{"GET", base + "/messages?state=failed", "", 400, "unknown_field", "state"},
		{"GET", base + "/messages?status=failed&status=pending", "", 400, "duplicate_field", "status"},
		{"POST", base + "/messages", "", 405, "method_not_allowed", ""},
		{"GET", base + "/messages/not-a-uuid/attempts", "", 404, "not_found", ""},
		{"POST", base + "/messages/not-a-uuid/resend", "", 404, "not_found", ""},
		{"POST", base + "/messages/0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60/resend", `{"x":1}`, 400, "unknown_field", "x"},
		{"POST", base + "/recover", "", 400, "invalid_json", ""},
		{"POST", base + "/recover", `{}`, 422, "invalid_field", "since"},
		{"POST", base + "/recover", `{"since":5}`, 400, "invalid_type", "since"},
		{"POST", base + "/recover", `{"since":"yesterday"}`, 422, "invalid_field", "since"},
		{"POST", base + "/recover", `{"since":"` + e.now.Add(time.Hour).Format(time.RFC3339) + `"}`, 422, "invalid_field", "since"},
		{"POST", base + "/recover", `{"since":"` + e.now.Add(-31*24*time.Hour).Format(time.RFC3339) + `"}`, 422, "invalid_field", "since"},
		{"POST", base + "/recover", `{"since":"` + recent + `","until":"` + recent + `"}`, 400, "unknown_field", "until"},
		{"GET", base + "/recover", "", 405, "method_not_allowed", ""},
		{"POST", base + "/test", `{"event_type":"x"}`, 400, "unknown_field", "event_type"},
		// The account's limit (3): this one is the third, the next is refused.
		{"POST", coll, `{"url":"` + hook + `"}`, 201, "", ""},
		{"POST", coll, `{"url":"` + hook + `"}`, 409, "too_many_endpoints", ""},
	}
	for _, tt := range tests {
		before := e.snapshot()
		res := e.do("acct", tt.method, tt.path, tt.body)
		if res.status != tt.status || errorCode(res) != tt.code || errorField(res) != tt.field {
			t.Errorf("%s %s %s: %d %s; want %d %s field %q", tt.method, tt.path, tt.body, res.status, res.raw, tt.status, tt.code, tt.field)
			continue
		}
		if tt.status == 405 && res.header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", tt.method, tt.path)
		}
		if tt.status >= 400 {
			if after := e.snapshot(); after != before {
				t.Errorf("%s %s %s changed the endpoints:\n%s\n%s", tt.method, tt.path, tt.body, before, after)
			}
		}
	}
	if res := e.do("acct", "PUT", "/accounts/acct/webhook_endpoints", ""); res.header.Get("Allow") != "GET, POST" {
		t.Errorf("Allow: %q", res.header.Get("Allow"))
	}
	if e.wakes.Load() != 0 {
		t.Errorf("bad input woke the sender %d times", e.wakes.Load())
	}
}

// Another account's endpoint, and an account the caller may not act on,
// are not found on every route, and nothing changes.
func TestOtherAccountIsNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhookapi.Config{})
	victim := e.create("victim", `{"url":"`+hook+`"}`)["id"].(string)
	e.create("evil", `{"url":"`+hook+`"}`)
	const msg = "0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60"
	since := `{"since":"` + e.now.Add(-time.Hour).Format(time.RFC3339) + `"}`
	routes := []struct{ method, path, body string }{
		{"GET", "/webhook_endpoints/" + victim, ""},
		{"PATCH", "/webhook_endpoints/" + victim, `{"url":"https://evil.example.com/"}`},
		{"DELETE", "/webhook_endpoints/" + victim, ""},
		{"POST", "/webhook_endpoints/" + victim + "/disable", ""},
		{"POST", "/webhook_endpoints/" + victim + "/enable", ""},
		{"POST", "/webhook_endpoints/" + victim + "/secret/rotate", ""},
		{"GET", "/webhook_endpoints/" + victim + "/messages", ""},
		{"GET", "/webhook_endpoints/" + victim + "/messages/" + msg + "/attempts", ""},
		{"POST", "/webhook_endpoints/" + victim + "/messages/" + msg + "/resend", ""},
		{"POST", "/webhook_endpoints/" + victim + "/recover", since},
		{"POST", "/webhook_endpoints/" + victim + "/test", ""},
	}
	before := e.snapshot()
	for _, rt := range routes {
		// evil names its own account and the victim's endpoint.
		if res := e.do("evil", rt.method, "/accounts/evil"+rt.path, rt.body); res.status != 404 || errorCode(res) != "not_found" {
			t.Errorf("%s /accounts/evil%s: %d %s, want 404", rt.method, rt.path, res.status, res.raw)
		}
		// evil names the victim's account.
		if res := e.do("evil", rt.method, "/accounts/victim"+rt.path, rt.body); res.status != 404 || errorCode(res) != "not_found" {
			t.Errorf("%s /accounts/victim%s as evil: %d %s, want 404", rt.method, rt.path, res.status, res.raw)
		}
	}
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/webhook_endpoints", ""}, {"POST", "/webhook_endpoints", `{"url":"` + hook + `"}`}} {
		if res := e.do("evil", rt.method, "/accounts/victim"+rt.path, rt.body); res.status != 404 {
			t.Errorf("%s /accounts/victim%s as evil: %d %s, want 404", rt.method, rt.path, res.status, res.raw)
		}
	}
	if after := e.snapshot(); after != before {
		t.Errorf("another account changed the endpoints:\n%s\n%s", before, after)
	}
	if e.wakes.Load() != 0 {
		t.Errorf("another account woke the sender %d times", e.wakes.Load())
	}
	list := e.do("evil", "GET", "/accounts/evil/webhook_endpoints", "")
	if strings.Contains(list.raw, victim) {
		t.Fatalf("evil lists the victim's endpoint: %s", list.raw)
	}
}

// The responses that hold a secret give it to an Idempotency-Key wrapper's
// replay without it; the service's Command runs the commands.
func TestShownOnce(t *testing.T) {
	t.Parallel()
	var stored []string
	var pool *pgxpool.Pool
	command := func(w http.ResponseWriter, r *http.Request, in any, status int, fn func(context.Context, pgx.Tx) (any, error)) {
		var out any
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) (err error) {
			out, err = fn(r.Context(), tx)
			return err
		})
		if err != nil {
			if !webhookapi.WriteKnownError(w, err) {
				t.Errorf("an error WriteKnownError does not know: %v", err)
				w.WriteHeader(500)
			}
			return
		}
		replay := out
		if s, ok := out.(webhookapi.ShownOncer); ok {
			replay = s.ShownOnce()
		}
		b, _ := json.Marshal(replay)
		stored = append(stored, string(b))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(out)
	}
	e := newEnv(t, webhookapi.Config{Command: command})
	pool = e.pool
	c := e.create("acct", `{"url":"`+hook+`"}`)
	rot := e.do("acct", "POST", "/accounts/acct/webhook_endpoints/"+c["id"].(string)+"/secret/rotate", "")
	if rot.status != 200 || rot.body["secret"] == nil {
		t.Fatalf("rotate: %d %s", rot.status, rot.raw)
	}
	if len(stored) != 2 {
		t.Fatalf("the service's Command ran %d times, want 2", len(stored))
	}
	for _, s := range stored {
		if strings.Contains(s, "whsec_") || strings.Contains(s, `"secret"`) {
			t.Errorf("a replay holds the secret: %s", s)
		}
	}
	if !strings.Contains(stored[0], c["id"].(string)) || !strings.Contains(stored[1], "previous_secret_expires_at") {
		t.Errorf("replays: %v", stored)
	}
	// A known error through the service's Command is mapped, not a 500.
	if res := e.do("acct", "POST", "/accounts/acct/webhook_endpoints", `{"url":"https://10.1.2.3/"}`); res.status != 422 || errorField(res) != "url" {
		t.Fatalf("validation through Command: %d %s", res.status, res.raw)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	store, _ := endpoints.New(endpoints.Config{})
	allow := func(*http.Request, string) bool { return true }
	for name, cfg := range map[string]webhookapi.Config{
		"Endpoints": {Pool: &pgxpool.Pool{}, Authorize: allow},
		"Pool":      {Endpoints: store, Authorize: allow},
		"Authorize": {Endpoints: store, Pool: &pgxpool.Pool{}},
	} {
		if _, err := webhookapi.New(cfg); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("without %s: %v", name, err)
		}
	}
	// Every wrong field at once, each named.
	_, err := webhookapi.New(webhookapi.Config{MaxRecoverAge: -time.Hour})
	for _, want := range []string{"Endpoints: is required", "Pool: is required", "Authorize: is required", "MaxRecoverAge: must be positive"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

// An error the API does not know is a 500 without detail; the detail goes
// to the log.
func TestInternalErrorHasNoDetail(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	e := newEnv(t, webhookapi.Config{Logger: logger})
	id := e.create("acct", `{"url":"`+hook+`"}`)["id"].(string)
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE webhook_endpoint_deliveries RENAME TO gone`); err != nil {
		t.Fatal(err)
	}
	res := e.do("acct", "POST", "/accounts/acct/webhook_endpoints/"+id+"/disable", "")
	if res.status != 500 || errorCode(res) != "internal" || strings.Contains(res.raw, "gone") || strings.Contains(res.raw, "webhook_endpoint_deliveries") {
		t.Fatalf("disable: %d %s", res.status, res.raw)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "webhook_endpoint_deliveries") {
		t.Fatalf("the detail is not logged: %s", logs.String())
	}
	if got := e.do("acct", "GET", "/accounts/acct/webhook_endpoints/"+id, ""); got.body["disabled"] != false {
		t.Fatalf("a failed disable changed the endpoint: %s", got.raw)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// With CanonicalAccount, an account spelt otherwise is the same account,
// and a spelling that names none is not found.
func TestCanonicalAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhookapi.Config{CanonicalAccount: func(a string) (string, bool) {
		return strings.ToLower(a), !strings.Contains(a, "*")
	}})
	c := e.create("acct", `{"url":"`+hook+`"}`)
	res := e.do("acct", "POST", "/accounts/ACCT/webhook_endpoints", `{"url":"`+hook+`"}`)
	if res.status != 201 || res.body["account_id"] != "acct" {
		t.Fatalf("create as ACCT: %d %s", res.status, res.raw)
	}
	if res := e.do("acct", "GET", "/accounts/Acct/webhook_endpoints/"+c["id"].(string), ""); res.status != 200 {
		t.Fatalf("get as Acct: %d %s", res.status, res.raw)
	}
	if res := e.do("acct*", "GET", "/accounts/acct*/webhook_endpoints", ""); res.status != 404 {
		t.Fatalf("a spelling that names no account: %d %s", res.status, res.raw)
	}
}
