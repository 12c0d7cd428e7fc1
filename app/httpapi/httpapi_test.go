package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/app/httpapi"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
)

const (
	testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	maxBody         = 1 << 20
)

// env is one API served over HTTP on a schema of its own.
type env struct {
	t      *testing.T
	url    string
	pool   *pgxpool.Pool
	client *http.Client
	// apiKey is sent as "Authorization: Bearer <apiKey>" unless a request
	// sets that header itself: an admin key, as setup makes it.
	apiKey string
}

func setup(t *testing.T) *env {
	t.Helper()
	return setupWith(t, httpapi.Config{})
}

// setupWith is setup with cfg's options (Service and Pool are set here).
func setupWith(t *testing.T, cfg httpapi.Config) *env {
	t.Helper()
	return setupWriter(t, cfg, outbox.Config{Routes: app.Routes})
}

// setupWriter is setupWith whose service writes its events with an
// outbox writer of wcfg.
func setupWriter(t *testing.T, cfg httpapi.Config, wcfg outbox.Config) *env {
	t.Helper()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	w, err := outbox.NewWriter(wcfg)
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: s.Pool, Events: w})
	require.NoError(t, err)
	cfg.Service, cfg.Pool = svc, s.Pool
	api, err := httpapi.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	admin, err := apikey.Create(context.Background(), s.Pool, apikey.New{Name: "test admin"})
	require.NoError(t, err)
	return &env{t: t, url: srv.URL, pool: s.Pool, client: srv.Client(), apiKey: admin.Secret}
}

// as returns a copy of e that sends key.
func (e *env) as(key string) *env {
	c := *e
	c.apiKey = key
	return &c
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

type merchant struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	WebhookURL    string `json:"webhook_url"`
	WebhookSecret string `json:"webhook_secret"`
	CreatedAt     string `json:"created_at"`
	APIKey        string `json:"api_key"`
}

type paymentJSON struct {
	ID             string `json:"id"`
	MerchantID     string `json:"merchant_id"`
	Amount         int64  `json:"amount"`
	RefundedAmount int64  `json:"refunded_amount"`
	Currency       string `json:"currency"`
	Status         string `json:"status"`
	Version        int64  `json:"version"`
	CreatedAt      string `json:"created_at"`
	UpdatedAt      string `json:"updated_at"`
}

// rawBody is sent as is; any other non-nil body is encoded as JSON.
type rawBody []byte

// do sends a request. body nil sends no body.
func (e *env) do(method, path string, body any, headers map[string]string) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case rawBody:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		require.NoError(e.t, err)
		rd = bytes.NewReader(enc)
	}
	res, err := e.send(method, path, rd, headers)
	require.NoError(e.t, err)
	return res
}

// send is do without require, for use from other goroutines.
func (e *env) send(method, path string, body io.Reader, headers map[string]string) (response, error) {
	req, err := http.NewRequest(method, e.url+path, body)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if e.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+e.apiKey)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
		if v == "" {
			req.Header.Del(k) // "": send without it
		}
	}
	res, err := e.client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: b}, nil
}

// post sends a POST, with an Idempotency-Key when key is not empty.
func (e *env) post(path string, body any, key string) response {
	e.t.Helper()
	var h map[string]string
	if key != "" {
		h = map[string]string{"Idempotency-Key": key}
	}
	return e.do(http.MethodPost, path, body, h)
}

func (e *env) get(path string) response {
	e.t.Helper()
	return e.do(http.MethodGet, path, nil, nil)
}

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	require.Equal(t, "application/json", r.Header.Get("Content-Type"), "body: %s", r.Body)
	var v T
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), "body: %s", r.Body)
	return v
}

// requireError checks the status and the error body.
func requireError(t *testing.T, r response, status int, code, field string) apiError {
	t.Helper()
	require.Equal(t, status, r.Status, "body: %s", r.Body)
	got := decode[struct {
		Error apiError `json:"error"`
	}](t, r).Error
	require.Equal(t, code, got.Code, "body: %s", r.Body)
	require.Equal(t, field, got.Field, "body: %s", r.Body)
	require.NotEmpty(t, got.Message)
	return got
}

func (e *env) createMerchant() merchant {
	e.t.Helper()
	r := e.post("/v1/merchants", map[string]any{"name": "Acme", "webhook_url": "https://acme.example/hooks"}, "")
	require.Equal(e.t, http.StatusCreated, r.Status, "body: %s", r.Body)
	return decode[merchant](e.t, r)
}

func (e *env) createPayment(merchantID string, amount int64) paymentJSON {
	e.t.Helper()
	r := e.post("/v1/payments", map[string]any{"merchant_id": merchantID, "amount": amount, "currency": "EUR"}, "")
	require.Equal(e.t, http.StatusCreated, r.Status, "body: %s", r.Body)
	return decode[paymentJSON](e.t, r)
}

func (e *env) paidPayment(merchantID string, amount int64) paymentJSON {
	e.t.Helper()
	p := e.createPayment(merchantID, amount)
	r := e.post("/v1/payments/"+p.ID+"/pay", nil, "")
	require.Equal(e.t, http.StatusOK, r.Status, "body: %s", r.Body)
	return decode[paymentJSON](e.t, r)
}

// counts is the number of rows of every table a command writes.
type counts struct {
	Merchants, Payments, LedgerTransactions, LedgerEntries, Outbox, IdempotencyKeys, APIKeys int
}

func (e *env) counts() counts {
	e.t.Helper()
	var c counts
	err := e.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM merchants),
		(SELECT count(*) FROM payments),
		(SELECT count(*) FROM ledger_transactions),
		(SELECT count(*) FROM ledger_entries),
		(SELECT count(*) FROM outbox),
		(SELECT count(*) FROM idempotency_keys),
		(SELECT count(*) FROM api_keys)`).
		Scan(&c.Merchants, &c.Payments, &c.LedgerTransactions, &c.LedgerEntries, &c.Outbox, &c.IdempotencyKeys, &c.APIKeys)
	require.NoError(e.t, err)
	return c
}

// paymentState is what the database holds for one payment.
type paymentState struct {
	Status        string
	Version       int64
	Refunded      int64
	OutboxRows    int
	LedgerEntries int
}

func (e *env) paymentState(id string) paymentState {
	e.t.Helper()
	var s paymentState
	err := e.pool.QueryRow(context.Background(), `SELECT p.status, p.version, p.refunded_amount,
		(SELECT count(*) FROM outbox o WHERE o.aggregate_type = 'payment' AND o.aggregate_id = p.id::text),
		(SELECT count(*) FROM ledger_entries le JOIN ledger_transactions lt ON lt.id = le.transaction_id WHERE lt.payment_id = p.id)
		FROM payments p WHERE p.id = $1`, id).
		Scan(&s.Status, &s.Version, &s.Refunded, &s.OutboxRows, &s.LedgerEntries)
	require.NoError(e.t, err)
	return s
}

type outboxRow struct {
	AggregateVersion int64
	EventType        string
	Topic            string
	Payload          map[string]any
	Metadata         map[string]string
}

func (e *env) outboxRows(aggregateID string) []outboxRow {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `
		SELECT aggregate_version, event_type, topic, payload, metadata FROM outbox
		WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY id`, paymentevents.AggregateType, aggregateID)
	require.NoError(e.t, err)
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		require.NoError(e.t, rows.Scan(&r.AggregateVersion, &r.EventType, &r.Topic, &r.Payload, &r.Metadata))
		out = append(out, r)
	}
	require.NoError(e.t, rows.Err())
	return out
}

func TestValidationErrorsChangeNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	paid := e.paidPayment(m.ID, 1000)

	validPayment := func(overrides map[string]any) rawBody {
		body := map[string]any{"merchant_id": m.ID, "amount": 1250, "currency": "EUR"}
		for k, v := range overrides {
			if v == nil {
				delete(body, k)
				continue
			}
			body[k] = v
		}
		b, err := json.Marshal(body)
		require.NoError(t, err)
		return b
	}
	// A valid request padded with whitespace past the limit: only its size is wrong.
	valid := validPayment(nil)
	tooLarge := append(append(rawBody{}, valid...), bytes.Repeat([]byte(" "), maxBody+1-len(valid))...)
	require.Len(t, tooLarge, maxBody+1)

	refund := "/v1/payments/" + paid.ID + "/refund"
	tests := []struct {
		name   string
		path   string
		body   any
		key    string // Idempotency-Key; the default is a fresh one per case
		status int
		code   string
		field  string
	}{
		{"payment body not JSON", "/v1/payments", rawBody(`not json`), "", 400, "invalid_json", ""},
		{"payment body truncated JSON", "/v1/payments", rawBody(`{"merchant_id": "`), "", 400, "invalid_json", ""},
		{"payment body a JSON array", "/v1/payments", rawBody(`[1, 2]`), "", 400, "invalid_json", ""},
		{"payment body a JSON string", "/v1/payments", rawBody(`"hello"`), "", 400, "invalid_json", ""},
		{"payment unknown field", "/v1/payments", validPayment(map[string]any{"colour": "red"}), "", 400, "unknown_field", "colour"},
		{"payment amount a string", "/v1/payments", validPayment(map[string]any{"amount": "12"}), "", 400, "invalid_type", "amount"},
		{"payment amount a fraction", "/v1/payments", rawBody(fmt.Sprintf(`{"merchant_id":%q,"amount":1.5,"currency":"EUR"}`, m.ID)), "", 400, "invalid_type", "amount"},
		{"payment amount beyond int64", "/v1/payments", rawBody(fmt.Sprintf(`{"merchant_id":%q,"amount":9223372036854775808,"currency":"EUR"}`, m.ID)), "", 400, "invalid_type", "amount"},
		{"payment currency a number", "/v1/payments", validPayment(map[string]any{"currency": 978}), "", 400, "invalid_type", "currency"},
		{"payment amount zero", "/v1/payments", validPayment(map[string]any{"amount": 0}), "", 422, "invalid_field", "amount"},
		{"payment amount negative", "/v1/payments", validPayment(map[string]any{"amount": -100}), "", 422, "invalid_field", "amount"},
		{"payment amount missing", "/v1/payments", validPayment(map[string]any{"amount": nil}), "", 422, "invalid_field", "amount"},
		{"payment unknown currency", "/v1/payments", validPayment(map[string]any{"currency": "XYZ"}), "", 422, "invalid_field", "currency"},
		{"payment lowercase currency", "/v1/payments", validPayment(map[string]any{"currency": "eur"}), "", 422, "invalid_field", "currency"},
		{"payment currency missing", "/v1/payments", validPayment(map[string]any{"currency": nil}), "", 422, "invalid_field", "currency"},
		{"payment merchant_id missing", "/v1/payments", validPayment(map[string]any{"merchant_id": nil}), "", 422, "invalid_field", "merchant_id"},
		{"payment merchant_id not a UUID", "/v1/payments", validPayment(map[string]any{"merchant_id": "merchant-1"}), "", 422, "invalid_field", "merchant_id"},
		{"payment merchant_id unknown", "/v1/payments", validPayment(map[string]any{"merchant_id": uuid.NewString()}), "", 422, "invalid_field", "merchant_id"},
		{"payment empty body", "/v1/payments", nil, "", 400, "invalid_json", ""},
		{"payment whitespace body", "/v1/payments", rawBody(" \n\t "), "", 400, "invalid_json", ""},
		{"payment body of two JSON values", "/v1/payments", rawBody(string(valid) + " " + string(valid)), "", 400, "invalid_json", ""},
		{"payment body with trailing garbage", "/v1/payments", rawBody(string(valid) + " x"), "", 400, "invalid_json", ""},
		{"payment body over 1 MiB", "/v1/payments", tooLarge, "", 413, "body_too_large", ""},
		{"payment Idempotency-Key too long", "/v1/payments", valid, strings.Repeat("k", 256), 400, "invalid_header", "Idempotency-Key"},
		{"merchant empty name", "/v1/merchants", map[string]any{"name": "", "webhook_url": "https://x.example/h"}, "", 422, "invalid_field", "name"},
		{"merchant blank name", "/v1/merchants", map[string]any{"name": "   ", "webhook_url": "https://x.example/h"}, "", 422, "invalid_field", "name"},
		{"merchant name too long", "/v1/merchants", map[string]any{"name": strings.Repeat("n", 201), "webhook_url": "https://x.example/h"}, "", 422, "invalid_field", "name"},
		{"merchant webhook_url missing", "/v1/merchants", map[string]any{"name": "Acme"}, "", 422, "invalid_field", "webhook_url"},
		{"merchant webhook_url ftp", "/v1/merchants", map[string]any{"name": "Acme", "webhook_url": "ftp://x"}, "", 422, "invalid_field", "webhook_url"},
		{"merchant webhook_url not a URL", "/v1/merchants", map[string]any{"name": "Acme", "webhook_url": "not a url"}, "", 422, "invalid_field", "webhook_url"},
		{"merchant webhook_url relative", "/v1/merchants", map[string]any{"name": "Acme", "webhook_url": "/hooks"}, "", 422, "invalid_field", "webhook_url"},
		{"merchant webhook_url with credentials", "/v1/merchants", map[string]any{"name": "Acme", "webhook_url": "https://u:p@x.example/h"}, "", 422, "invalid_field", "webhook_url"},
		{"merchant unknown field", "/v1/merchants", map[string]any{"name": "Acme", "webhook_url": "https://x.example/h", "secret": "s"}, "", 400, "unknown_field", "secret"},
		{"merchant empty body", "/v1/merchants", nil, "", 400, "invalid_json", ""},
		{"refund amount zero", refund, map[string]any{"amount": 0}, "", 422, "invalid_field", "amount"},
		{"refund amount negative", refund, map[string]any{"amount": -1}, "", 422, "invalid_field", "amount"},
		{"refund amount above the refundable rest", refund, map[string]any{"amount": 1001}, "", 422, "invalid_field", "amount"},
		{"refund amount a string", refund, map[string]any{"amount": "5"}, "", 400, "invalid_type", "amount"},
		{"refund unknown field", refund, map[string]any{"amount": 5, "reason": "r"}, "", 400, "unknown_field", "reason"},
		{"refund body not JSON", refund, rawBody(`amount=5`), "", 400, "invalid_json", ""},
		{"pay unknown field", "/v1/payments/" + paid.ID + "/pay", map[string]any{"amount": 5}, "", 400, "unknown_field", "amount"},
		{"cancel body not JSON", "/v1/payments/" + paid.ID + "/cancel", rawBody(`{`), "", 400, "invalid_json", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := *e
			e.t = t
			key := tt.key
			if key == "" {
				key = "validation-" + uuid.NewString()
			}
			// Every case is rejected, so the parallel cases do not disturb each other's counts.
			before := e.counts()
			r := e.post(tt.path, tt.body, key)
			requireError(t, r, tt.status, tt.code, tt.field)
			require.Equal(t, before, e.counts(), "a rejected request must change nothing")
		})
	}

	t.Run("the paid payment is untouched", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		// Runs alongside the cases above; what matters is that none of them moved it.
		st := e.paymentState(paid.ID)
		require.Equal(t, paymentState{Status: "paid", Version: 2, OutboxRows: 2, LedgerEntries: 2}, st)
	})
}

func TestUnknownIDsAreNotFound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	e.paidPayment(m.ID, 500) // something that must stay as it is

	ids := map[string]string{
		"random UUID": uuid.NewString(),
		"not a UUID":  "not-a-uuid",
	}
	for name, id := range ids {
		for _, op := range []struct {
			method, suffix string
			body           any
		}{
			{http.MethodGet, "", nil},
			{http.MethodPost, "/pay", nil},
			{http.MethodPost, "/refund", nil},
			{http.MethodPost, "/refund", map[string]any{"amount": 10}},
			{http.MethodPost, "/cancel", nil},
		} {
			t.Run(fmt.Sprintf("%s %s%s body=%v", name, op.method, op.suffix, op.body != nil), func(t *testing.T) {
				t.Parallel()
				e := *e
				e.t = t
				before := e.counts()
				var h map[string]string
				if op.method == http.MethodPost {
					h = map[string]string{"Idempotency-Key": uuid.NewString()}
				}
				r := e.do(op.method, "/v1/payments/"+id+op.suffix, op.body, h)
				requireError(t, r, http.StatusNotFound, "not_found", "")
				require.Equal(t, before, e.counts())
			})
		}
	}

	t.Run("merchant", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		requireError(t, e.get("/v1/merchants/"+uuid.NewString()), http.StatusNotFound, "not_found", "")
		requireError(t, e.get("/v1/merchants/not-a-uuid"), http.StatusNotFound, "not_found", "")
	})
}

func TestWrongMethodAndUnknownPath(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	p := e.createPayment(m.ID, 700)

	methodTests := []struct {
		method, path, allow string
	}{
		{http.MethodDelete, "/v1/payments", "POST"},
		{http.MethodGet, "/v1/payments", "POST"},
		{http.MethodPut, "/v1/payments/" + p.ID, "GET"},
		{http.MethodDelete, "/v1/payments/" + p.ID, "GET"},
		{http.MethodGet, "/v1/payments/" + p.ID + "/pay", "POST"},
		{http.MethodGet, "/v1/payments/" + p.ID + "/refund", "POST"},
		{http.MethodPatch, "/v1/payments/" + p.ID + "/cancel", "POST"},
		{http.MethodGet, "/v1/merchants", "POST"},
		{http.MethodPost, "/healthz", "GET"},
		{http.MethodPost, "/readyz", "GET"},
	}
	for _, tt := range methodTests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			t.Parallel()
			e := *e
			e.t = t
			before := e.counts()
			r := e.do(tt.method, tt.path, rawBody(`{}`), nil)
			requireError(t, r, http.StatusMethodNotAllowed, "method_not_allowed", "")
			require.Equal(t, tt.allow, r.Header.Get("Allow"))
			require.Equal(t, before, e.counts())
		})
	}

	for _, path := range []string{"/", "/v1", "/v1/nope", "/v2/payments", "/v1/payments/" + p.ID + "/capture", "/v1/payments/" + p.ID + "/pay/again"} {
		t.Run("unknown path "+path, func(t *testing.T) {
			t.Parallel()
			e := *e
			e.t = t
			for _, method := range []string{http.MethodGet, http.MethodPost} {
				requireError(t, e.do(method, path, nil, nil), http.StatusNotFound, "not_found", "")
			}
		})
	}

	t.Run("payment unchanged", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		got := decode[paymentJSON](t, e.get("/v1/payments/"+p.ID))
		require.Equal(t, p, got)
	})
}

func TestInvalidTransitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()

	fullyRefunded := func() paymentJSON {
		p := e.paidPayment(m.ID, 300)
		r := e.post("/v1/payments/"+p.ID+"/refund", nil, "")
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		return decode[paymentJSON](t, r)
	}
	canceled := func() paymentJSON {
		p := e.createPayment(m.ID, 300)
		r := e.post("/v1/payments/"+p.ID+"/cancel", nil, "")
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		return decode[paymentJSON](t, r)
	}
	tests := []struct {
		name    string
		payment paymentJSON
		action  string
		body    any
	}{
		{"pay twice", e.paidPayment(m.ID, 300), "pay", nil},
		{"cancel a paid payment", e.paidPayment(m.ID, 300), "cancel", nil},
		{"refund a pending payment", e.createPayment(m.ID, 300), "refund", nil},
		{"refund a pending payment with an amount", e.createPayment(m.ID, 300), "refund", map[string]any{"amount": 100}},
		{"refund a fully refunded payment", fullyRefunded(), "refund", nil},
		{"refund a fully refunded payment with an amount", fullyRefunded(), "refund", map[string]any{"amount": 1}},
		{"cancel a refunded payment", fullyRefunded(), "cancel", nil},
		{"pay a canceled payment", canceled(), "pay", nil},
		{"cancel twice", canceled(), "cancel", nil},
		{"refund a canceled payment", canceled(), "refund", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := *e
			e.t = t
			before := e.paymentState(tt.payment.ID)
			require.Equal(t, tt.payment.Version, before.Version)
			require.Equal(t, int(tt.payment.Version), before.OutboxRows)

			key := "transition-" + uuid.NewString()
			r := e.post("/v1/payments/"+tt.payment.ID+"/"+tt.action, tt.body, key)
			requireError(t, r, http.StatusConflict, "invalid_transition", "")

			require.Equal(t, before, e.paymentState(tt.payment.ID), "version, outbox and ledger must be unchanged")
			require.Equal(t, tt.payment, decode[paymentJSON](t, e.get("/v1/payments/"+tt.payment.ID)))
			var keys int
			require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key).Scan(&keys))
			require.Zero(t, keys, "a failed request must not store its Idempotency-Key")
		})
	}
}

func TestHappyPath(t *testing.T) {
	t.Parallel()
	e := setup(t)

	r := e.post("/v1/merchants", map[string]any{"name": "Acme GmbH", "webhook_url": "https://acme.example/hooks"}, "")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	m := decode[merchant](t, r)
	require.NoError(t, uuid.Validate(m.ID))
	require.Equal(t, "Acme GmbH", m.Name)
	require.Equal(t, "https://acme.example/hooks", m.WebhookURL)
	require.True(t, strings.HasPrefix(m.WebhookSecret, "whsec_"), "secret %q", m.WebhookSecret)
	require.Greater(t, len(m.WebhookSecret), len("whsec_")+32)
	require.NotEmpty(t, m.CreatedAt)

	// A merchant read back does not carry its secret.
	r = e.get("/v1/merchants/" + m.ID)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.NotContains(t, string(r.Body), "webhook_secret")
	require.NotContains(t, string(r.Body), m.WebhookSecret)
	got := decode[merchant](t, r)
	require.Equal(t, merchant{ID: m.ID, Name: m.Name, WebhookURL: m.WebhookURL, CreatedAt: m.CreatedAt}, got)

	r = e.post("/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 10000, "currency": "EUR"}, "")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	p := decode[paymentJSON](t, r)
	require.NoError(t, uuid.Validate(p.ID))
	require.Equal(t, m.ID, p.MerchantID)
	require.Equal(t, int64(10000), p.Amount)
	require.Zero(t, p.RefundedAmount)
	require.Equal(t, "EUR", p.Currency)
	require.Equal(t, "pending", p.Status)
	require.Equal(t, int64(1), p.Version)
	require.Equal(t, p, decode[paymentJSON](t, e.get("/v1/payments/"+p.ID)))

	step := func(action string, body any, status string, version, refunded int64) paymentJSON {
		t.Helper()
		r := e.post("/v1/payments/"+p.ID+"/"+action, body, "")
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		got := decode[paymentJSON](t, r)
		require.Equal(t, p.ID, got.ID)
		require.Equal(t, p.Amount, got.Amount)
		require.Equal(t, p.CreatedAt, got.CreatedAt)
		require.Equal(t, status, got.Status)
		require.Equal(t, version, got.Version)
		require.Equal(t, refunded, got.RefundedAmount)
		require.Equal(t, got, decode[paymentJSON](t, e.get("/v1/payments/"+p.ID)), "GET must return what the command returned")
		return got
	}
	step("pay", nil, "paid", 2, 0)
	step("refund", map[string]any{"amount": 2500}, "partially_refunded", 3, 2500)
	last := step("refund", nil, "refunded", 4, 10000)
	require.Equal(t, last, decode[paymentJSON](t, e.get("/v1/payments/"+p.ID)))

	rows := e.outboxRows(p.ID)
	require.Len(t, rows, 4)
	wantTypes := []string{paymentevents.CreatedType, paymentevents.PaidType, paymentevents.RefundedType, paymentevents.RefundedType}
	for i, row := range rows {
		require.Equal(t, int64(i+1), row.AggregateVersion)
		require.Equal(t, wantTypes[i], row.EventType)
		require.Equal(t, app.PaymentsTopic, row.Topic)
		require.NotEmpty(t, row.Metadata["correlation_id"])
	}
	require.EqualValues(t, 2500, rows[2].Payload["amount"])
	require.EqualValues(t, 7500, rows[3].Payload["amount"])
	require.EqualValues(t, 10000, rows[3].Payload["refunded_amount"])

	c := e.counts()
	require.Equal(t, counts{Merchants: 1, Payments: 1, LedgerTransactions: 3, LedgerEntries: 6, Outbox: 4, APIKeys: 2}, c, "API keys: the test's admin and the merchant's")

	ctx := context.Background()
	ltRows, err := e.pool.Query(ctx, `
		SELECT lt.kind, count(le.id), sum(le.amount)
		FROM ledger_transactions lt JOIN ledger_entries le ON le.transaction_id = lt.id
		WHERE lt.payment_id = $1
		GROUP BY lt.id, lt.kind, lt.created_at ORDER BY lt.created_at, lt.kind`, p.ID)
	require.NoError(t, err)
	type ledgerSum struct {
		Kind    string
		Entries int
		Sum     int64
	}
	var sums []ledgerSum
	for ltRows.Next() {
		var s ledgerSum
		require.NoError(t, ltRows.Scan(&s.Kind, &s.Entries, &s.Sum))
		sums = append(sums, s)
	}
	require.NoError(t, ltRows.Err())
	require.ElementsMatch(t, []ledgerSum{
		{"payment_captured", 2, 0}, {"payment_refunded", 2, 0}, {"payment_refunded", 2, 0},
	}, sums, "every ledger transaction sums to zero")

	// Per account: everything captured was refunded.
	var cash, payable int64
	require.NoError(t, e.pool.QueryRow(ctx, `
		SELECT coalesce(sum(amount) FILTER (WHERE account = 'psp:cash'), 0),
		       coalesce(sum(amount) FILTER (WHERE account = 'merchant:' || $1 || ':payable'), 0)
		FROM ledger_entries`, m.ID).Scan(&cash, &payable))
	require.Zero(t, cash)
	require.Zero(t, payable)
}

func TestCancelPendingPayment(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	p := e.createPayment(m.ID, 4200)

	r := e.post("/v1/payments/"+p.ID+"/cancel", rawBody(`{}`), "")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	got := decode[paymentJSON](t, r)
	require.Equal(t, "canceled", got.Status)
	require.Equal(t, int64(2), got.Version)

	rows := e.outboxRows(p.ID)
	require.Len(t, rows, 2)
	require.Equal(t, paymentevents.CanceledType, rows[1].EventType)
	require.Equal(t, int64(2), rows[1].AggregateVersion)
	require.Zero(t, e.paymentState(p.ID).LedgerEntries, "no money moved")
}

func TestIdempotentCreatePayment(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	before := e.counts()

	const key = "create-1"
	body := map[string]any{"merchant_id": m.ID, "amount": 1999, "currency": "USD"}
	first := e.post("/v1/payments", body, key)
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))

	second := e.post("/v1/payments", body, key)
	require.Equal(t, http.StatusCreated, second.Status, "body: %s", second.Body)
	require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(second.Body))
	p1, p2 := decode[paymentJSON](t, first), decode[paymentJSON](t, second)
	require.Equal(t, p1.ID, p2.ID)

	// The same request formatted differently is the same request.
	reformatted := rawBody(fmt.Sprintf("{\n  \"currency\": \"USD\",\n  \"amount\": 1999,\n  \"merchant_id\": %q\n}\n", m.ID))
	third := e.post("/v1/payments", reformatted, key)
	require.Equal(t, http.StatusCreated, third.Status, "body: %s", third.Body)
	require.Equal(t, "true", third.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(third.Body))

	want := before
	want.Payments++
	want.Outbox++
	want.IdempotencyKeys++
	require.Equal(t, want, e.counts())
	require.Len(t, e.outboxRows(p1.ID), 1)

	// The same key with another request is refused and changes nothing.
	for name, tt := range map[string]struct {
		path string
		body any
	}{
		"other amount":   {"/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 2000, "currency": "USD"}},
		"other currency": {"/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 1999, "currency": "EUR"}},
		"other path":     {"/v1/payments/" + p1.ID + "/pay", nil},
		"merchant path":  {"/v1/merchants", map[string]any{"name": "Other", "webhook_url": "https://o.example/h"}},
	} {
		r := e.post(tt.path, tt.body, key)
		require.Empty(t, r.Header.Get("Idempotent-Replayed"), name)
		requireError(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key")
		require.Equal(t, want, e.counts(), name)
	}
	require.Equal(t, "pending", e.paymentState(p1.ID).Status, "the pay with a reused key must not have run")

	// Another key is another request.
	other := e.post("/v1/payments", body, "create-2")
	require.Equal(t, http.StatusCreated, other.Status, "body: %s", other.Body)
	require.Empty(t, other.Header.Get("Idempotent-Replayed"))
	require.NotEqual(t, p1.ID, decode[paymentJSON](t, other).ID)
}

// The webhook secret is shown once: a replayed creation answers the same
// merchant without it, and the stored response does not hold it either.
func TestIdempotentCreateMerchantOmitsSecretOnReplay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := map[string]any{"name": "Acme", "webhook_url": "https://acme.example/hooks"}
	first := e.post("/v1/merchants", body, "merchant-key")
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	created := decode[merchant](t, first)
	require.NotEmpty(t, created.WebhookSecret)
	second := e.post("/v1/merchants", body, "merchant-key")
	require.Equal(t, http.StatusCreated, second.Status, "body: %s", second.Body)
	require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
	require.NotContains(t, string(second.Body), "webhook_secret")
	require.NotContains(t, string(second.Body), "api_key")
	replayed := decode[merchant](t, second)
	require.NotEmpty(t, created.APIKey)
	require.Empty(t, replayed.APIKey, "the merchant's API key is shown once, and not stored: %s", second.Body)
	created.WebhookSecret, created.APIKey = "", ""
	require.Equal(t, created, replayed, "the same merchant, without its secret or its key")
	require.Equal(t, 1, e.counts().Merchants)
	var stored string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT convert_from(response_body, 'UTF8') FROM idempotency_keys`).Scan(&stored))
	require.NotContains(t, stored, strings.TrimPrefix(decode[merchant](t, first).WebhookSecret, "whsec_"))
}

func TestIdempotentPay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	p := e.createPayment(m.ID, 5000)

	path := "/v1/payments/" + p.ID + "/pay"
	first := e.post(path, nil, "pay-1")
	require.Equal(t, http.StatusOK, first.Status, "body: %s", first.Body)
	// No body and {} are the same request.
	second := e.post(path, rawBody(`{}`), "pay-1")
	require.Equal(t, http.StatusOK, second.Status, "body: %s", second.Body)
	require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(second.Body))
	got := decode[paymentJSON](t, second)
	require.Equal(t, "paid", got.Status)
	require.Equal(t, int64(2), got.Version)

	st := e.paymentState(p.ID)
	require.Equal(t, int64(2), st.Version)
	require.Equal(t, 2, st.LedgerEntries, "one capture")
	rows := e.outboxRows(p.ID)
	require.Len(t, rows, 2)
	require.Equal(t, paymentevents.PaidType, rows[1].EventType)

	// Without the key, paying again is a conflict: the key, not luck, made the retry succeed.
	requireError(t, e.post(path, nil, ""), http.StatusConflict, "invalid_transition", "")

	// The same key on another payment is another request.
	p2 := e.createPayment(m.ID, 5000)
	requireError(t, e.post("/v1/payments/"+p2.ID+"/pay", nil, "pay-1"), http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key")
	require.Equal(t, int64(1), e.paymentState(p2.ID).Version)
}

func TestIdempotentRefund(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	p := e.paidPayment(m.ID, 1000)
	path := "/v1/payments/" + p.ID + "/refund"

	first := e.post(path, map[string]any{"amount": 300}, "refund-1")
	require.Equal(t, http.StatusOK, first.Status, "body: %s", first.Body)
	second := e.post(path, map[string]any{"amount": 300}, "refund-1")
	require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(second.Body))
	require.Equal(t, paymentState{Status: "partially_refunded", Version: 3, Refunded: 300, OutboxRows: 3, LedgerEntries: 4}, e.paymentState(p.ID))

	// A refund of the rest (no amount) under the same key is another request.
	requireError(t, e.post(path, nil, "refund-1"), http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key")
	require.Equal(t, int64(3), e.paymentState(p.ID).Version)
}

func TestFailedRequestStoresNoKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()

	t.Run("conflict", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		paid := e.paidPayment(m.ID, 100)
		pending := e.createPayment(m.ID, 100)
		const key = "fails-with-409"

		// Paying a paid payment fails with the key...
		requireError(t, e.post("/v1/payments/"+paid.ID+"/pay", nil, key), http.StatusConflict, "invalid_transition", "")
		// ... and a retry of the same request fails again, rather than replaying.
		requireError(t, e.post("/v1/payments/"+paid.ID+"/pay", nil, key), http.StatusConflict, "invalid_transition", "")
		var n int
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key).Scan(&n))
		require.Zero(t, n)

		// The key is free: a valid request with it runs.
		r := e.post("/v1/payments/"+pending.ID+"/pay", nil, key)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.Empty(t, r.Header.Get("Idempotent-Replayed"))
		require.Equal(t, "paid", decode[paymentJSON](t, r).Status)
	})

	t.Run("validation", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		const key = "fails-with-422"
		// Rejected after the key was claimed in the transaction: a foreign-key violation.
		bad := map[string]any{"merchant_id": uuid.NewString(), "amount": 100, "currency": "EUR"}
		requireError(t, e.post("/v1/payments", bad, key), http.StatusUnprocessableEntity, "invalid_field", "merchant_id")

		good := map[string]any{"merchant_id": m.ID, "amount": 100, "currency": "EUR"}
		r := e.post("/v1/payments", good, key)
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		require.Empty(t, r.Header.Get("Idempotent-Replayed"))
		p := decode[paymentJSON](t, r)

		r = e.post("/v1/payments", good, key)
		require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
		require.Equal(t, p.ID, decode[paymentJSON](t, r).ID)
	})

	t.Run("not found", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		const key = "fails-with-404"
		requireError(t, e.post("/v1/payments/"+uuid.NewString()+"/cancel", nil, key), http.StatusNotFound, "not_found", "")
		p := e.createPayment(m.ID, 100)
		r := e.post("/v1/payments/"+p.ID+"/cancel", nil, key)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.Equal(t, "canceled", decode[paymentJSON](t, r).Status)
	})
}

func TestIdempotentConcurrentRequests(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	before := e.counts()

	const n = 20
	body, err := json.Marshal(map[string]any{"merchant_id": m.ID, "amount": 777, "currency": "GBP"})
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		res   = make([]response, n)
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			res[i], errs[i] = e.send(http.MethodPost, "/v1/payments", bytes.NewReader(body),
				map[string]string{"Idempotency-Key": "concurrent-key"})
		})
	}
	close(start)
	wg.Wait()

	replayed := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, http.StatusCreated, res[i].Status, "body: %s", res[i].Body)
		require.Equal(t, string(res[0].Body), string(res[i].Body), "all responses must be the same")
		if res[i].Header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	require.Equal(t, n-1, replayed, "exactly one request ran the command")
	p := decode[paymentJSON](t, res[0])

	want := before
	want.Payments++
	want.Outbox++
	want.IdempotencyKeys++
	require.Equal(t, want, e.counts())
	require.Len(t, e.outboxRows(p.ID), 1)
}

func TestConcurrentPaysOnePayment(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	p := e.createPayment(m.ID, 900)

	const n = 10
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		res   = make([]response, n)
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			res[i], errs[i] = e.send(http.MethodPost, "/v1/payments/"+p.ID+"/pay", nil, nil)
		})
	}
	close(start)
	wg.Wait()

	ok := 0
	for i := range n {
		require.NoError(t, errs[i])
		switch res[i].Status {
		case http.StatusOK:
			ok++
		default:
			requireError(t, res[i], http.StatusConflict, "invalid_transition", "")
		}
	}
	require.Equal(t, 1, ok, "the row lock lets exactly one pay through")
	require.Equal(t, paymentState{Status: "paid", Version: 2, OutboxRows: 2, LedgerEntries: 2}, e.paymentState(p.ID))
}

func TestTraceparentAndCorrelationID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()

	r := e.do(http.MethodPost, "/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 100, "currency": "EUR"},
		map[string]string{"traceparent": testTraceparent, "X-Correlation-ID": "corr-42"})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, "corr-42", r.Header.Get("X-Correlation-ID"))
	p := decode[paymentJSON](t, r)

	r = e.do(http.MethodPost, "/v1/payments/"+p.ID+"/pay", nil,
		map[string]string{"traceparent": testTraceparent, "X-Correlation-ID": "corr-43"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, "corr-43", r.Header.Get("X-Correlation-ID"))

	rows := e.outboxRows(p.ID)
	require.Len(t, rows, 2)
	require.Equal(t, testTraceparent, rows[0].Metadata["traceparent"])
	require.Equal(t, "corr-42", rows[0].Metadata["correlation_id"])
	require.Equal(t, testTraceparent, rows[1].Metadata["traceparent"])
	require.Equal(t, "corr-43", rows[1].Metadata["correlation_id"])

	// Without the headers: a generated correlation id, echoed and stored; no traceparent.
	// An invalid traceparent is dropped.
	r = e.do(http.MethodPost, "/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 100, "currency": "EUR"},
		map[string]string{"traceparent": "not-a-traceparent"})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	corr := r.Header.Get("X-Correlation-ID")
	require.NoError(t, uuid.Validate(corr), "generated correlation id %q", corr)
	rows = e.outboxRows(decode[paymentJSON](t, r).ID)
	require.Len(t, rows, 1)
	require.Equal(t, corr, rows[0].Metadata["correlation_id"])
	_, hasTP := rows[0].Metadata["traceparent"]
	require.False(t, hasTP, "an invalid traceparent must not be stored: %v", rows[0].Metadata)

	// Error responses echo the correlation id too.
	r = e.do(http.MethodGet, "/v1/payments/"+uuid.NewString(), nil, map[string]string{"X-Correlation-ID": "corr-44"})
	require.Equal(t, http.StatusNotFound, r.Status)
	require.Equal(t, "corr-44", r.Header.Get("X-Correlation-ID"))

	// An over-long correlation id is replaced.
	r = e.do(http.MethodGet, "/healthz", nil, map[string]string{"X-Correlation-ID": strings.Repeat("c", 129)})
	require.NoError(t, uuid.Validate(r.Header.Get("X-Correlation-ID")))
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	e := setup(t).as("") // probes carry no API key
	for _, path := range []string{"/healthz", "/readyz"} {
		r := e.get(path)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", path, r.Body)
		require.Equal(t, map[string]string{"status": "ok"}, decode[map[string]string](t, r))
	}
}

func TestReadinessFailsWithoutDatabase(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	closed, err := pgxpool.New(context.Background(), s.URL)
	require.NoError(t, err)
	closed.Close()
	svc, err := app.NewService(app.Config{Pool: closed, Events: w})
	require.NoError(t, err)
	api, err := httpapi.New(httpapi.Config{Service: svc, Pool: closed})
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	e := &env{t: t, url: srv.URL, pool: s.Pool, client: srv.Client()} // no key: /readyz and /healthz are open

	requireError(t, e.get("/readyz"), http.StatusServiceUnavailable, "database_unavailable", "")
	r := e.get("/healthz")
	require.Equal(t, http.StatusOK, r.Status, "liveness does not depend on the database")
}

func TestNewRequiresServiceAndPool(t *testing.T) {
	t.Parallel()
	_, err := httpapi.New(httpapi.Config{})
	require.Error(t, err)
}

// TestKnownBugs holds regression tests for bugs in the non-test code that
// this file may not fix. Each asserts the documented behaviour and is skipped
// until the bug is fixed; remove the skip with the fix.
func TestRegressions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	valid, err := json.Marshal(map[string]any{"merchant_id": m.ID, "amount": 5, "currency": "EUR"})
	require.NoError(t, err)

	t.Run("trailing closing bracket after the body is rejected", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		for _, tail := range []string{"}", "]"} {
			before := e.counts()
			requireError(t, e.post("/v1/payments", rawBody(string(valid)+tail), ""), http.StatusBadRequest, "invalid_json", "")
			require.Equal(t, before, e.counts())
		}
	})

	t.Run("urn:uuid ids are not found", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		id := "urn:uuid:" + uuid.NewString()
		requireError(t, e.get("/v1/payments/"+id), http.StatusNotFound, "not_found", "")
		requireError(t, e.post("/v1/payments/"+id+"/pay", nil, ""), http.StatusNotFound, "not_found", "")
		requireError(t, e.get("/v1/merchants/"+id), http.StatusNotFound, "not_found", "")
	})

	t.Run("merchant_id in urn:uuid form is invalid", func(t *testing.T) {
		t.Parallel()
		e := *e
		e.t = t
		before := e.counts()
		r := e.post("/v1/payments", map[string]any{"merchant_id": "urn:uuid:" + m.ID, "amount": 5, "currency": "EUR"}, "")
		requireError(t, r, http.StatusUnprocessableEntity, "invalid_field", "merchant_id")
		require.Equal(t, before, e.counts())
	})

	// The two subtests that write (a payment, a merchant) are not
	// parallel: they end before the parallel ones start, whose counts of
	// every table, before and after a refused request, they would change.
	t.Run("merchant_id is canonical in the response and the event", func(t *testing.T) {
		e := *e
		e.t = t
		r := e.post("/v1/payments", map[string]any{"merchant_id": "{" + strings.ToUpper(m.ID) + "}", "amount": 5, "currency": "EUR"}, "")
		if r.Status == http.StatusUnprocessableEntity {
			requireError(t, r, http.StatusUnprocessableEntity, "invalid_field", "merchant_id")
			return
		}
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		p := decode[paymentJSON](t, r)
		require.Equal(t, m.ID, p.MerchantID)
		rows := e.outboxRows(p.ID)
		require.Len(t, rows, 1)
		require.Equal(t, m.ID, rows[0].Payload["merchant_id"])
	})

	t.Run("merchant name the database refuses is a validation error", func(t *testing.T) {
		e := *e
		e.t = t
		for _, name := range []string{" " + strings.Repeat("n", 201), "a\x00b", "tab\there"} {
			before := e.counts()
			r := e.post("/v1/merchants", map[string]any{"name": name, "webhook_url": "https://x.example/h"}, "")
			requireError(t, r, http.StatusUnprocessableEntity, "invalid_field", "name")
			require.Equal(t, before, e.counts())
		}
		// Surrounding space is trimmed before the length check and storage.
		r := e.post("/v1/merchants", map[string]any{"name": " " + strings.Repeat("é", 200) + " ", "webhook_url": "https://x.example/h"}, "")
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	})
}
