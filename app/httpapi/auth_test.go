package httpapi_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/app/httpapi"
)

// keyState is what the database holds of the API keys: a rejected request
// must not even record a use.
func (e *env) keyState() string {
	e.t.Helper()
	var s string
	err := e.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(
		id::text || ':' || coalesce(revoked_at::text, '-') || ':' || coalesce(last_used_at::text, '-'), ',' ORDER BY id), '')
		FROM api_keys`).Scan(&s)
	require.NoError(e.t, err)
	return s
}

// every endpoint of the API, with a body it would accept.
func endpoints(merchantID, paymentID string) []struct {
	method, path string
	body         any
} {
	return []struct {
		method, path string
		body         any
	}{
		{http.MethodPost, "/v1/merchants", map[string]any{"name": "X", "webhook_url": "https://x.example/h"}},
		{http.MethodGet, "/v1/merchants/" + merchantID, nil},
		{http.MethodGet, "/v1/merchants/" + merchantID + "/stats", nil},
		{http.MethodPost, "/v1/merchants/" + merchantID + "/api_keys", nil},
		{http.MethodPost, "/v1/merchants/" + merchantID + "/webhook_secret/rotate", nil},
		{http.MethodPost, "/v1/payments", map[string]any{"merchant_id": merchantID, "amount": 100, "currency": "EUR"}},
		{http.MethodGet, "/v1/payments/" + paymentID, nil},
		{http.MethodPost, "/v1/payments/" + paymentID + "/pay", nil},
		{http.MethodPost, "/v1/payments/" + paymentID + "/refund", map[string]any{"amount": 10}},
		{http.MethodPost, "/v1/payments/" + paymentID + "/cancel", nil},
		{http.MethodGet, "/v1/nope", nil},
	}
}

func TestRequestsWithoutAValidKeyAre401(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	p := e.createPayment(m.ID, 1000)
	revoked, err := apikey.Create(context.Background(), e.pool, apikey.New{Name: "to revoke"})
	require.NoError(t, err)
	_, err = apikey.Revoke(context.Background(), e.pool, revoked.ID)
	require.NoError(t, err)
	unknown, err := apikey.Create(context.Background(), e.pool, apikey.New{})
	require.NoError(t, err)
	_, err = e.pool.Exec(context.Background(), `DELETE FROM api_keys WHERE id = $1`, unknown.ID) // a well-formed key the database never saw
	require.NoError(t, err)

	auths := map[string]string{
		"no header":          "",
		"empty bearer":       "Bearer ",
		"basic scheme":       "Basic " + e.apiKey,
		"key without scheme": e.apiKey,
		"unknown key":        "Bearer " + unknown.Secret,
		"revoked key":        "Bearer " + revoked.Secret,
		"truncated key":      "Bearer " + e.apiKey[:len(e.apiKey)-1],
		"not UTF-8":          "Bearer ofk_\xff\xfe",
		"merchant's secret":  "Bearer " + m.WebhookSecret,
	}
	before, keys := e.counts(), e.keyState()
	for name, auth := range auths {
		for _, ep := range endpoints(m.ID, p.ID) {
			t.Run(name+" "+ep.method+" "+ep.path, func(t *testing.T) {
				e := *e
				e.t = t
				r := e.do(ep.method, ep.path, ep.body, map[string]string{"Authorization": auth, "Idempotency-Key": "k-" + name})
				requireError(t, r, http.StatusUnauthorized, "unauthorized", "")
				require.Equal(t, `Bearer realm="outflow"`, r.Header.Get("WWW-Authenticate"))
			})
		}
	}
	require.Equal(t, before, e.counts(), "a rejected request changes nothing")
	require.Equal(t, keys, e.keyState())
	require.Equal(t, "pending", e.paymentState(p.ID).Status)

	// The scheme is case-insensitive; probes need no key.
	r := e.do(http.MethodGet, "/v1/payments/"+p.ID, nil, map[string]string{"Authorization": "bearer " + e.apiKey})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	for _, path := range []string{"/healthz", "/readyz"} {
		r := e.do(http.MethodGet, path, nil, map[string]string{"Authorization": ""})
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", path, r.Body)
	}
}

func TestRevokedKeyIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	mk := e.as(m.APIKey)
	r := mk.get("/v1/merchants/" + m.ID)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	var id string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT id::text FROM api_keys WHERE merchant_id = $1`, m.ID).Scan(&id))
	k, err := apikey.Revoke(context.Background(), e.pool, id)
	require.NoError(t, err)
	require.NotNil(t, k.RevokedAt)
	require.NotNil(t, k.LastUsedAt, "the successful GET was recorded")

	before := e.counts()
	requireError(t, mk.get("/v1/merchants/"+m.ID), http.StatusUnauthorized, "unauthorized", "")
	requireError(t, mk.post("/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 100, "currency": "EUR"}, "after-revoke"),
		http.StatusUnauthorized, "unauthorized", "")
	require.Equal(t, before, e.counts())
	// The admin key is another key: untouched.
	require.Equal(t, http.StatusOK, e.get("/v1/merchants/"+m.ID).Status)
}

// A merchant's key sees its own merchant only. Everything of another
// merchant answers exactly as if it did not exist, and changes nothing.
func TestMerchantKeyActsOnItsOwnMerchantOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, b := e.createMerchant(), e.createMerchant()
	require.True(t, strings.HasPrefix(a.APIKey, apikey.Scheme), "api_key %q", a.APIKey)
	require.NotEqual(t, a.APIKey, b.APIKey)
	ak := e.as(a.APIKey)
	bPending := e.createPayment(b.ID, 1000)
	bPaid := e.paidPayment(b.ID, 1000)
	missing := uuid.NewString()

	tests := []struct {
		name, method, path string
		body               any
		id                 string // of the other merchant's thing, in the message
	}{
		{"read B's payment", http.MethodGet, "/v1/payments/" + bPending.ID, nil, bPending.ID},
		{"pay B's payment", http.MethodPost, "/v1/payments/" + bPending.ID + "/pay", nil, bPending.ID},
		{"cancel B's payment", http.MethodPost, "/v1/payments/" + bPending.ID + "/cancel", nil, bPending.ID},
		{"refund B's payment", http.MethodPost, "/v1/payments/" + bPaid.ID + "/refund", nil, bPaid.ID},
		{"refund part of B's payment", http.MethodPost, "/v1/payments/" + bPaid.ID + "/refund", map[string]any{"amount": 10}, bPaid.ID},
		{"read B", http.MethodGet, "/v1/merchants/" + b.ID, nil, b.ID},
		{"read B in upper case", http.MethodGet, "/v1/merchants/" + strings.ToUpper(b.ID), nil, strings.ToUpper(b.ID)},
		{"read B's stats", http.MethodGet, "/v1/merchants/" + b.ID + "/stats", nil, b.ID},
		{"make a key for B", http.MethodPost, "/v1/merchants/" + b.ID + "/api_keys", nil, b.ID},
		{"rotate B's webhook secret", http.MethodPost, "/v1/merchants/" + b.ID + "/webhook_secret/rotate", nil, b.ID},
	}
	unknownPath := func(path, id string) string { return strings.ReplaceAll(path, id, missing) }
	before, keys := e.counts(), e.keyState()
	bState := []paymentState{e.paymentState(bPending.ID), e.paymentState(bPaid.ID)}
	bSecret := func() (row string) {
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT row(m.*)::text FROM merchants m WHERE id = $1`, b.ID).Scan(&row))
		return row
	}
	bSecretBefore := bSecret()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ak.do(tt.method, tt.path, tt.body, map[string]string{"Idempotency-Key": "iso-" + tt.name})
			requireError(t, r, http.StatusNotFound, "not_found", "")
			want := ak.do(tt.method, unknownPath(tt.path, tt.id), tt.body, map[string]string{"Idempotency-Key": "iso-unknown-" + tt.name})
			require.Equal(t, want.Status, r.Status)
			require.Equal(t, string(want.Body), strings.ReplaceAll(string(r.Body), tt.id, missing),
				"indistinguishable from an unknown id")
		})
	}
	t.Run("pay B", func(t *testing.T) {
		body := map[string]any{"merchant_id": b.ID, "amount": 100, "currency": "EUR"}
		r := ak.post("/v1/payments", body, "iso-create")
		requireError(t, r, http.StatusUnprocessableEntity, "invalid_field", "merchant_id")
		body["merchant_id"] = missing
		want := ak.post("/v1/payments", body, "iso-create-unknown")
		require.Equal(t, string(want.Body), string(r.Body), "the answer an unknown merchant gets")
	})
	t.Run("create a merchant", func(t *testing.T) {
		r := ak.post("/v1/merchants", map[string]any{"name": "Mine", "webhook_url": "https://mine.example/h"}, "iso-merchant")
		requireError(t, r, http.StatusNotFound, "not_found", "")
	})
	require.Equal(t, before, e.counts(), "nothing written, not even an Idempotency-Key")
	require.Equal(t, keys, e.keyState(), "a rejected request does not even count as a use of the key")
	require.Equal(t, bState, []paymentState{e.paymentState(bPending.ID), e.paymentState(bPaid.ID)})
	require.Equal(t, bSecretBefore, bSecret(), "B's webhook secrets untouched")

	// Its own merchant, it may do everything with.
	require.Equal(t, http.StatusOK, ak.get("/v1/merchants/"+a.ID).Status)
	require.Equal(t, http.StatusOK, ak.get("/v1/merchants/"+strings.ToUpper(a.ID)+"/stats").Status)
	mine := ak.post("/v1/payments", map[string]any{"merchant_id": a.ID, "amount": 700, "currency": "EUR"}, "")
	require.Equal(t, http.StatusCreated, mine.Status, "body: %s", mine.Body)
	p := decode[paymentJSON](t, mine)
	for _, step := range []string{"pay", "refund"} {
		r := ak.post("/v1/payments/"+p.ID+"/"+step, nil, "")
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", step, r.Body)
	}
	require.Equal(t, "refunded", decode[paymentJSON](t, ak.get("/v1/payments/"+p.ID)).Status)

	// The admin key may do everything, on every merchant.
	require.Equal(t, http.StatusOK, e.get("/v1/payments/"+p.ID).Status)
	require.Equal(t, http.StatusOK, e.get("/v1/merchants/"+b.ID+"/stats").Status)
	r := e.post("/v1/payments/"+bPending.ID+"/pay", nil, "")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
}

func TestMerchantMakesMoreKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	mk := e.as(m.APIKey)

	type keyJSON struct {
		ID         string `json:"id"`
		Prefix     string `json:"prefix"`
		Name       string `json:"name"`
		MerchantID string `json:"merchant_id"`
		CreatedAt  string `json:"created_at"`
		APIKey     string `json:"api_key"`
	}
	first := mk.post("/v1/merchants/"+m.ID+"/api_keys", map[string]any{"name": "checkout"}, "more-keys")
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	k := decode[keyJSON](t, first)
	require.Equal(t, "checkout", k.Name)
	require.Equal(t, m.ID, k.MerchantID)
	require.True(t, strings.HasPrefix(k.APIKey, k.Prefix), "prefix %q of %q", k.Prefix, k.APIKey)
	require.NotEqual(t, m.APIKey, k.APIKey)
	require.Equal(t, http.StatusOK, e.as(k.APIKey).get("/v1/merchants/"+m.ID).Status, "the new key works")

	// A replay answers without the key, which is stored nowhere.
	again := mk.post("/v1/merchants/"+m.ID+"/api_keys", map[string]any{"name": "checkout"}, "more-keys")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	k2 := decode[keyJSON](t, again)
	require.Empty(t, k2.APIKey)
	secret := k.APIKey
	k.APIKey = ""
	require.Equal(t, k, k2)
	var leaked int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE position(convert_to($1, 'UTF8') IN response_body) > 0 OR position(convert_to($2, 'UTF8') IN response_body) > 0`,
		secret, `"api_key"`).Scan(&leaked))
	require.Zero(t, leaked, "no stored response holds an API key")

	// The admin may make keys for any merchant; an unknown one is a 404.
	r := e.post("/v1/merchants/"+m.ID+"/api_keys", nil, "")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	before := e.counts()
	requireError(t, e.post("/v1/merchants/"+uuid.NewString()+"/api_keys", nil, ""), http.StatusNotFound, "not_found", "")
	requireError(t, e.post("/v1/merchants/not-a-uuid/api_keys", nil, ""), http.StatusNotFound, "not_found", "")
	requireError(t, mk.post("/v1/merchants/"+m.ID+"/api_keys", map[string]any{"name": "a\x00b"}, ""), http.StatusUnprocessableEntity, "invalid_field", "name")
	requireError(t, mk.post("/v1/merchants/"+m.ID+"/api_keys", map[string]any{"name": strings.Repeat("n", 201)}, ""), http.StatusUnprocessableEntity, "invalid_field", "name")
	require.Equal(t, before, e.counts())
}

// Idempotency-Keys belong to the API key that sent them.
func TestIdempotencyKeyIsScopedToTheAPIKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	mk := e.as(m.APIKey)
	other, err := apikey.Create(context.Background(), e.pool, apikey.New{MerchantID: m.ID})
	require.NoError(t, err)
	ok2 := e.as(other.Secret)
	body := map[string]any{"merchant_id": m.ID, "amount": 4200, "currency": "EUR"}

	ids := map[string]bool{}
	for i, c := range []*env{e, mk, ok2} {
		r := c.post("/v1/payments", body, "same-key")
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		require.Empty(t, r.Header.Get("Idempotent-Replayed"), "client %d: another API key's request, not a replay", i)
		ids[decode[paymentJSON](t, r).ID] = true
		// Its own retry replays.
		again := c.post("/v1/payments", body, "same-key")
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	}
	require.Len(t, ids, 3, "three API keys, three payments")
	require.Equal(t, 3, e.counts().IdempotencyKeys)

	// The same value with another request, from another API key, is not a reuse.
	p := e.createPayment(m.ID, 100)
	r := e.post("/v1/payments/"+p.ID+"/cancel", nil, "cancel-key")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r = mk.post("/v1/payments", body, "cancel-key")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"))
}

func TestRateLimitPerKey(t *testing.T) {
	t.Parallel()
	// One token per 100 s: the test does not race the refill.
	e := setupWith(t, httpapi.Config{RateLimit: httpapi.RateLimit{PerSecond: 0.01, Burst: 3}})
	m := e.createMerchant() // the admin's first token
	for range 2 {
		require.Equal(t, http.StatusOK, e.get("/v1/merchants/"+m.ID).Status)
	}
	before := e.counts()
	r := e.post("/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 100, "currency": "EUR"}, "limited")
	requireError(t, r, http.StatusTooManyRequests, "rate_limited", "")
	secs, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", r.Header.Get("Retry-After"))
	require.InDelta(t, 100, secs, 2, "the time one token takes")
	require.Equal(t, before, e.counts(), "a limited request changes nothing")
	requireError(t, e.get("/v1/merchants/"+m.ID), http.StatusTooManyRequests, "rate_limited", "")

	// Another key has a bucket of its own; probes are not limited.
	mk := e.as(m.APIKey)
	for range 3 {
		require.Equal(t, http.StatusOK, mk.get("/v1/merchants/"+m.ID).Status)
	}
	requireError(t, mk.get("/v1/merchants/"+m.ID), http.StatusTooManyRequests, "rate_limited", "")
	for range 5 {
		require.Equal(t, http.StatusOK, e.get("/healthz").Status)
	}
}
