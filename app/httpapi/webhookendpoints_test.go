package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	whendpoints "github.com/outflow-dev/outflow/webhooks/endpoints"
)

// endpointJSON is an endpoint as the API answers it; Secret only when
// created.
type endpointJSON struct {
	whendpoints.Endpoint
	Secret string `json:"secret"`
}

func (e *env) endpointCount(account string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM webhook_endpoints WHERE account_id = $1`, account).Scan(&n))
	return n
}

// A merchant created through the API has its webhook_url as an endpoint
// (migration 00034's trigger), whose id is the merchant's: what the
// merchant's key lists under /v1/merchants/{id}/webhook_endpoints.
func TestCreatedMerchantHasItsEndpoint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	r := e.as(m.APIKey).get("/v1/merchants/" + m.ID + "/webhook_endpoints")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	list := decode[struct {
		Data []endpointJSON `json:"data"`
	}](t, r)
	require.Len(t, list.Data, 1)
	ep := list.Data[0]
	require.Equal(t, m.ID, ep.ID)
	require.Equal(t, m.ID, ep.AccountID)
	require.Equal(t, m.WebhookURL, ep.URL)
	require.Empty(t, ep.EventTypes, "every event type, as the one URL had")
	require.Empty(t, ep.Secret, "never listed")
}

// The webhook routes are the merchant's: its key manages its endpoints;
// another merchant's key gets 404, as for an unknown merchant, and writes
// nothing; an admin key acts on any merchant that exists (an id in any
// case names it; the endpoint is stored under the merchant's own
// spelling), and on none that does not.
func TestWebhookEndpointRoutesAreMerchantScoped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, b := e.createMerchant(), e.createMerchant()
	asA, asB := e.as(a.APIKey), e.as(b.APIKey)
	base := "/v1/merchants/" + a.ID + "/webhook_endpoints"

	r := asA.post(base, map[string]any{"url": "https://acme.example/paid", "event_types": []string{"payment.paid"}}, "")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	created := decode[endpointJSON](t, r)
	require.True(t, strings.HasPrefix(created.Secret, "whsec_"))
	require.Equal(t, a.ID, created.AccountID)

	before := e.counts()
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, base},
		{http.MethodPost, base},
		{http.MethodGet, base + "/" + created.ID},
		{http.MethodPatch, base + "/" + created.ID},
		{http.MethodDelete, base + "/" + created.ID},
		{http.MethodPost, base + "/" + created.ID + "/disable"},
		{http.MethodPost, base + "/" + created.ID + "/secret/rotate"},
		{http.MethodGet, base + "/" + created.ID + "/messages"},
		{http.MethodPost, base + "/" + created.ID + "/test"},
	} {
		var body any
		if c.method == http.MethodPost || c.method == http.MethodPatch {
			body = map[string]any{"url": "https://evil.example/"}
			if !strings.HasSuffix(c.path, "_endpoints") {
				body = nil
			}
		}
		r := asB.do(c.method, c.path, body, nil)
		requireError(t, r, http.StatusNotFound, "not_found", "")
	}
	require.Equal(t, before, e.counts(), "nothing written")
	require.Equal(t, 2, e.endpointCount(a.ID), "the merchant's own two, no third")
	r = asA.get(base + "/" + created.ID)
	require.Equal(t, http.StatusOK, r.Status)
	require.False(t, decode[endpointJSON](t, r).Disabled)

	// B's key on its own merchant: its one endpoint, not A's.
	r = asB.get("/v1/merchants/" + b.ID + "/webhook_endpoints")
	require.Equal(t, http.StatusOK, r.Status)
	require.Len(t, decode[struct {
		Data []endpointJSON `json:"data"`
	}](t, r).Data, 1)
	requireError(t, asB.get("/v1/merchants/"+b.ID+"/webhook_endpoints/"+created.ID), http.StatusNotFound, "not_found", "")

	// Admin: any merchant that exists, in any case.
	r = e.post("/v1/merchants/"+strings.ToUpper(a.ID)+"/webhook_endpoints",
		map[string]any{"url": "https://acme.example/admin"}, "")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, a.ID, decode[endpointJSON](t, r).AccountID, "stored under the merchant's own spelling")
	require.Equal(t, 3, e.endpointCount(a.ID))
	unknown := "0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60"
	requireError(t, e.post("/v1/merchants/"+unknown+"/webhook_endpoints", map[string]any{"url": "https://acme.example/x"}, ""),
		http.StatusNotFound, "not_found", "")
	requireError(t, e.get("/v1/merchants/"+unknown+"/webhook_endpoints"), http.StatusNotFound, "not_found", "")
	requireError(t, e.get("/v1/merchants/nope/webhook_endpoints"), http.StatusNotFound, "not_found", "")
	require.Zero(t, e.endpointCount(unknown))
}

// An endpoint's URL is held to the merchants' policy (here: no private
// addresses), and bad input is a 422 naming the field, through the app's
// error shape.
func TestWebhookEndpointValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	base := "/v1/merchants/" + m.ID + "/webhook_endpoints"
	requireError(t, e.post(base, map[string]any{"url": "https://127.0.0.1/hooks"}, "private"),
		http.StatusUnprocessableEntity, "invalid_field", "url")
	requireError(t, e.post(base, map[string]any{"url": "https://acme.example/", "event_types": []string{"not a type"}}, "types"),
		http.StatusUnprocessableEntity, "invalid_field", "event_types")
	requireError(t, e.post(base, map[string]any{"url": "https://acme.example/", "colour": "red"}, ""),
		http.StatusBadRequest, "unknown_field", "colour")
	require.Equal(t, 1, e.endpointCount(m.ID))
	var keys int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&keys))
	require.Zero(t, keys, "a refused command keeps no Idempotency-Key")
}

// An endpoint created, or its secret rotated, with an Idempotency-Key
// shows the secret once: the replay answers the same status without it,
// and the stored response never held it.
func TestWebhookSecretsShownOnceOnReplay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	asM := e.as(m.APIKey)
	base := "/v1/merchants/" + m.ID + "/webhook_endpoints"
	in := map[string]any{"url": "https://acme.example/second", "description": "second"}

	first := asM.post(base, in, "create-1")
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	created := decode[endpointJSON](t, first)
	require.NotEmpty(t, created.Secret)
	replay := asM.post(base, in, "create-1")
	require.Equal(t, http.StatusCreated, replay.Status, "body: %s", replay.Body)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	require.NotContains(t, string(replay.Body), `"secret"`)
	require.NotContains(t, string(replay.Body), created.Secret)
	again := decode[endpointJSON](t, replay)
	require.Equal(t, created.ID, again.ID, "the same endpoint, not a second one")
	require.Equal(t, 2, e.endpointCount(m.ID))

	rotate := base + "/" + created.ID + "/secret/rotate"
	r := asM.post(rotate, nil, "rotate-1")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	rotated := decode[whendpoints.Rotated](t, r)
	require.NotEqual(t, created.Secret, rotated.Secret)
	r = asM.post(rotate, nil, "rotate-1")
	require.Equal(t, http.StatusOK, r.Status)
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.NotContains(t, string(r.Body), rotated.Secret)
	require.NotContains(t, string(r.Body), `"secret"`)

	rows, err := e.pool.Query(context.Background(), `SELECT response_body FROM idempotency_keys`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var body []byte
		require.NoError(t, rows.Scan(&body))
		require.NotContains(t, string(body), created.Secret)
		require.NotContains(t, string(body), rotated.Secret)
	}
	require.NoError(t, rows.Err())
}

// POST /v1/merchants/{id}/webhook_secret/rotate still rotates the
// merchant's secret, and the merchant's endpoint (id = merchant id)
// follows it (00034's trigger): the new secret and the previous one in
// its grace period are what the sender signs with.
func TestMerchantRotationReachesItsEndpoint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	r := e.post("/v1/merchants/"+m.ID+"/webhook_secret/rotate", nil, "")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	got := decode[rotation](t, r)
	var secret, previous string
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT secret, previous_secret FROM webhook_endpoints WHERE id = $1`, m.ID).Scan(&secret, &previous))
	require.Equal(t, got.WebhookSecret, secret)
	require.Equal(t, m.WebhookSecret, previous)
}
