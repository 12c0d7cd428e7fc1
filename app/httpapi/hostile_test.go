package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
)

// What encoding/json accepts silently and a proxy may read otherwise, and
// what the database cannot store, is a 400 that changes nothing.
func TestHostileBodiesAndHeadersChangeNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	paid := e.paidPayment(m.ID, 1000)
	refund := "/v1/payments/" + paid.ID + "/refund"
	pay := func(rest string) rawBody {
		return rawBody(fmt.Sprintf(`{"merchant_id":%q,"currency":"EUR"%s}`, m.ID, rest))
	}
	merchantBody := func(name string) map[string]any {
		return map[string]any{"name": name, "webhook_url": "https://x.example/h"}
	}
	tests := []struct {
		name    string
		path    string
		body    any
		headers map[string]string
		status  int
		code    string
		field   string
	}{
		{"duplicate amount", "/v1/payments", pay(`,"amount":1,"amount":100000`), nil, 400, "duplicate_field", "amount"},
		{"case-variant duplicate amount", "/v1/payments", pay(`,"amount":1,"AMOUNT":100000`), nil, 400, "duplicate_field", "AMOUNT"},
		{"Kelvin-sign duplicate", "/v1/merchants", rawBody("{\"name\":\"A\",\"webhook_url\":\"https://x.example/h\",\"webhoo\u212a_url\":\"https://y.example/h\"}"), nil, 400, "duplicate_field", "webhoo\u212a_url"},
		{"plain duplicate name", "/v1/merchants", rawBody(`{"name":"A","webhook_url":"https://x.example/h","name":"B"}`), nil, 400, "duplicate_field", "name"},
		{"case-variant key alone", "/v1/payments", pay(`,"Amount":100`), nil, 400, "unknown_field", "Amount"},
		{"case-variant refund amount", refund, rawBody(`{"AMOUNT":5}`), nil, 400, "unknown_field", "AMOUNT"},
		{"duplicate refund amount", refund, rawBody(`{"amount":1,"amount":5}`), nil, 400, "duplicate_field", "amount"},
		{"invalid UTF-8 in the body", "/v1/merchants", rawBody("{\"name\":\"Acme\xff\",\"webhook_url\":\"https://x.example/h\"}"), nil, 400, "invalid_utf8", ""},
		{"lone surrogate escape", "/v1/merchants", rawBody(`{"name":"Acme\udc00","webhook_url":"https://x.example/h"}`), nil, 400, "invalid_utf8", ""},
		{"high surrogate without its pair", "/v1/merchants", rawBody(`{"name":"Acme\ud800x","webhook_url":"https://x.example/h"}`), nil, 400, "invalid_utf8", ""},
		{"NUL escape", "/v1/merchants", rawBody(`{"name":"Ac\u0000me","webhook_url":"https://x.example/h"}`), nil, 422, "invalid_field", "name"},
		{"nested too deep", refund, rawBody(`{"x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`), nil, 400, "invalid_json", ""},
		{"non-UTF-8 Idempotency-Key", "/v1/payments", pay(`,"amount":100`), map[string]string{"Idempotency-Key": "k\xff\xfe"}, 400, "invalid_header", "Idempotency-Key"},
		{"non-UTF-8 X-Correlation-ID", "/v1/payments", pay(`,"amount":100`), map[string]string{"X-Correlation-ID": "c\xff"}, 400, "invalid_header", "X-Correlation-ID"},
		{"amount above the cap", "/v1/payments", pay(fmt.Sprintf(`,"amount":%d`, app.MaxAmount+1)), nil, 422, "invalid_field", "amount"},
		{"amount 2^63-1", "/v1/payments", pay(`,"amount":9223372036854775807`), nil, 422, "invalid_field", "amount"},
		{"refund above the cap", refund, map[string]any{"amount": app.MaxAmount + 1}, nil, 422, "invalid_field", "amount"},
		{"name with a right-to-left override", "/v1/merchants", merchantBody("Acme\u202egnp.exe"), nil, 422, "invalid_field", "name"},
		{"name with an isolate", "/v1/merchants", merchantBody("Acme\u2067x\u2069"), nil, 422, "invalid_field", "name"},
		{"name of zero-width spaces", "/v1/merchants", merchantBody("\u200b\u200c\u200d\ufeff"), nil, 422, "invalid_field", "name"},
		{"name of spaces and fillers", "/v1/merchants", merchantBody("\u3000\u3164 \u2800\u00a0"), nil, 422, "invalid_field", "name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := *e
			e.t = t
			h := map[string]string{"Idempotency-Key": "hostile-" + uuid.NewString()}
			for k, v := range tt.headers {
				h[k] = v
			}
			before := e.counts()
			r := e.do(http.MethodPost, tt.path, tt.body, h)
			requireError(t, r, tt.status, tt.code, tt.field)
			require.Equal(t, before, e.counts(), "a rejected request must change nothing")
		})
	}
}

// The largest amount is accepted, paid and refunded; valid names with
// accents, scripts and inner zero-width joiners (emoji) are too.
func TestAmountCapAndNamesAccepted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	p := e.paidPayment(m.ID, app.MaxAmount)
	require.Equal(t, app.MaxAmount, p.Amount)
	r := e.post("/v1/payments/"+p.ID+"/refund", map[string]any{"amount": app.MaxAmount}, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	for _, name := range []string{"Café Zoë", "東京ショップ", "שלום", "👩‍💻 Devs", "A\u200bB"} {
		r := e.post("/v1/merchants", map[string]any{"name": name, "webhook_url": "https://x.example/h"}, "")
		require.Equal(t, http.StatusCreated, r.Status, "%q: %s", name, r.Body)
	}
}

// /stats adds up sums past int64 exactly: never a negative, never a 500.
func TestStatsBeyondInt64(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	// 20,000 days of 9,223 max-amount payments each: each day's row holds
	// what a bigint can, the merchant's sum is far past it.
	_, err := e.pool.Exec(context.Background(), `
		INSERT INTO merchant_stats_daily (merchant_id, currency, day, paid_count, paid_amount, refunded_amount)
		SELECT $1, c, DATE '2000-01-01' + d, 9223, 9223 * $2::numeric, 9223 * $2::numeric
		FROM generate_series(0, 19999) d, unnest(ARRAY['EUR', 'USD']) c`, m.ID, app.MaxAmount)
	require.NoError(t, err)
	r := e.get("/v1/merchants/" + m.ID + "/stats")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var got struct {
		PaidCount      int64             `json:"paid_count"`
		PaidAmount     json.Number       `json:"paid_amount"`
		RefundedAmount json.Number       `json:"refunded_amount"`
		ByCurrency     []json.RawMessage `json:"by_currency"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &got))
	require.Equal(t, int64(2*20000*9223), got.PaidCount)
	require.Equal(t, "368920000000000000000000", got.PaidAmount.String()) // 2 × 20,000 × 9,223 × 10^15
	require.Equal(t, "368920000000000000000000", got.RefundedAmount.String())
	require.JSONEq(t, `{"currency":"EUR","paid_count":184460000,"paid_amount":184460000000000000000000,"refunded_amount":184460000000000000000000}`,
		string(got.ByCurrency[0]))
}
