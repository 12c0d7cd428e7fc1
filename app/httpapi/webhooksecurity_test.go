package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Webhook URLs that would aim the service at its own network are refused
// at creation with a 422 naming webhook_url, and change nothing.
func TestPrivateWebhookURLsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	before := e.counts()
	for _, u := range []string{
		"http://shop.example/hooks", // plain http
		"https://10.0.0.1/h",
		"https://169.254.169.254/latest/meta-data/",
		"https://127.0.0.1:6379/",
		"https://[::ffff:169.254.169.254]/",
		"https://[::1]/",
		"https://[fd00::1]/",
		"https://100.64.1.1/",
		"https://0.0.0.0/",
		"https://localhost/",
		"https://0x7f000001/",
		"http://:80/",
		"https://:443/",
		"https://shop.example:70000/",
		"https://shop.example/" + strings.Repeat("p", 2048),
	} {
		r := e.post("/v1/merchants", map[string]any{"name": "Acme", "webhook_url": u}, "key-"+u[:min(len(u), 60)])
		requireError(t, r, http.StatusUnprocessableEntity, "invalid_field", "webhook_url")
	}
	require.Equal(t, before, e.counts(), "no merchant and no idempotency key written")
}

// Webhook URLs whose host is a private address or a loopback name in a
// Unicode spelling (fullwidth, ideographic full stops, enclosed letters),
// which Go's HTTP client maps to the ASCII form before it dials, are
// refused at creation as that form is: a 422 whose JSON names
// webhook_url, and nothing written. The same spellings of a public name
// are accepted.
func TestUnicodeWebhookURLsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	before := e.counts()
	for i, u := range []string{
		"https://１２７．０．０．１/hooks",
		"https://127。0。0。1/hooks",
		"https://１６９．２５４．１６９．２５４/latest/meta-data/",
		"https://①②⑦.0.0.1:6379/",
		"https://０ｘ７ｆ．１/",
		"https://ｌｏｃａｌｈｏｓｔ/hooks",
		"https://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ/hooks",
		"https://localhost。/hooks",
		"https://api．ｌｏｃａｌｈｏｓｔ:8443/hooks",
		"https://ü_ber.example/hooks", // maps to no host name
	} {
		r := e.post("/v1/merchants", map[string]any{"name": "Acme", "webhook_url": u}, fmt.Sprintf("unicode-%d", i))
		got := requireError(t, r, http.StatusUnprocessableEntity, "invalid_field", "webhook_url")
		require.Contains(t, got.Message, "webhook_url", u)
	}
	require.Equal(t, before, e.counts(), "no merchant and no idempotency key written")

	r := e.post("/v1/merchants", map[string]any{"name": "Acme", "webhook_url": "https://ｓｈｏｐ.example/hooks"}, "unicode-public")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
}

type rotation struct {
	MerchantID              string     `json:"merchant_id"`
	WebhookSecret           string     `json:"webhook_secret"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

// Rotating gives a new secret once; the previous one stays for the grace
// period (the service's default, 24h); a replay omits the new secret; an
// unknown merchant is a 404 that changes nothing.
func TestRotateWebhookSecret(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := e.createMerchant()
	path := "/v1/merchants/" + m.ID + "/webhook_secret/rotate"

	r := e.post(path, nil, "rotate-1")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	got := decode[rotation](t, r)
	require.Equal(t, m.ID, got.MerchantID)
	require.True(t, strings.HasPrefix(got.WebhookSecret, "whsec_"))
	require.NotEqual(t, m.WebhookSecret, got.WebhookSecret)
	require.NotNil(t, got.PreviousSecretExpiresAt)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), *got.PreviousSecretExpiresAt, time.Minute)

	var cur, prev string
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT webhook_secret, previous_webhook_secret FROM merchants WHERE id = $1`, m.ID).Scan(&cur, &prev))
	require.Equal(t, got.WebhookSecret, cur, "stored as given: this service has no OUTFLOW_SECRET_KEY")
	require.Equal(t, m.WebhookSecret, prev)

	replay := e.post(path, nil, "rotate-1")
	require.Equal(t, http.StatusOK, replay.Status)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	require.NotContains(t, string(replay.Body), "webhook_secret")
	again := decode[rotation](t, replay)
	require.Equal(t, m.ID, again.MerchantID)
	require.Equal(t, got.PreviousSecretExpiresAt.UTC(), again.PreviousSecretExpiresAt.UTC())
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT webhook_secret FROM merchants WHERE id = $1`, m.ID).Scan(&cur))
	require.Equal(t, got.WebhookSecret, cur, "the replay did not rotate again")

	before := e.counts()
	requireError(t, e.post("/v1/merchants/0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60/webhook_secret/rotate", nil, ""),
		http.StatusNotFound, "not_found", "")
	requireError(t, e.post("/v1/merchants/nope/webhook_secret/rotate", nil, "k"), http.StatusNotFound, "not_found", "")
	require.Equal(t, before, e.counts())
}
