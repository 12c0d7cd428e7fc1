package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/app"
)

// shownOnce is a response holding a secret that is shown once: an
// Idempotency-Key stores, and a replay answers, its replay() form, without
// the secret (the secret is not kept in plaintext anywhere else either).
type shownOnce interface {
	replay() any
}

// rotatedSecret answers POST /v1/merchants/{id}/webhook_secret/rotate.
type rotatedSecret struct{ app.RotatedSecret }

// replay is the rotation without the new secret.
func (r rotatedSecret) replay() any {
	return struct {
		MerchantID              string     `json:"merchant_id"`
		PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	}{r.MerchantID, r.PreviousSecretExpiresAt}
}

// rotateWebhookSecret gives the merchant a new webhook secret, shown once;
// the previous one signs too until previous_secret_expires_at.
func (a *API) rotateWebhookSecret(w http.ResponseWriter, r *http.Request) {
	var in emptyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	if !a.requireMerchant(w, r) {
		return
	}
	id := r.PathValue("id")
	a.command(w, r, in, http.StatusOK, func(ctx context.Context, tx pgx.Tx) (any, error) {
		out, err := a.svc.RotateWebhookSecretTx(ctx, tx, id)
		return rotatedSecret{out}, err
	})
}
