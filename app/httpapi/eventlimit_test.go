package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/events/outbox"
)

// A command whose event the outbox refuses as too large answers 413
// event_too_large naming the request's field to shorten, and commits
// nothing: no merchant, no event, no key, and its Idempotency-Key is not
// taken (the same request again is refused again, not replayed).
func TestEventTooLargeIs413NamingTheField(t *testing.T) {
	t.Parallel()
	// A limit no payment event fits: the reference app's events are
	// small, a limit this low stands for a large one.
	e := setupWriter(t, httpapi.Config{}, outbox.Config{Routes: app.Routes, MaxEventBytes: 100})
	m := e.createMerchant() // no event
	before := e.counts()

	body := map[string]any{"merchant_id": m.ID, "amount": 1250, "currency": "EUR"}
	for range 2 {
		r := e.do(http.MethodPost, "/v1/payments", body, map[string]string{"Idempotency-Key": "k-large"})
		got := requireError(t, r, http.StatusRequestEntityTooLarge, "event_too_large", "merchant_id")
		require.Contains(t, got.Message, "payment.created")
		require.Contains(t, got.Message, "over the limit of 100")
		require.Equal(t, before, e.counts(), "nothing committed: no payment, ledger, event nor key")
	}
}
