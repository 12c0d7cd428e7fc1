package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
)

// openPaths answer without an API key: probes carry none.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true}

type principalKey struct{}

// principal is the API key a request was authenticated with; ok is false
// on a path served without one, so that every check fails closed (the zero
// Key would look like an admin's).
func principal(ctx context.Context) (k apikey.Key, ok bool) {
	k, ok = ctx.Value(principalKey{}).(apikey.Key)
	return k, ok
}

// isAdmin reports whether the request carries an admin key.
func isAdmin(ctx context.Context) bool {
	k, ok := principal(ctx)
	return ok && k.Admin()
}

// bearer returns the credentials of an "Authorization: Bearer <key>"
// header (the scheme is case-insensitive, RFC 9110 11.1).
func bearer(r *http.Request) string {
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(cred)
}

// authenticate serves next with the request's API key in its context, or
// answers 401 (no key, an unknown or a revoked one; one answer for all
// three) or 429 (the key's bucket is empty). Neither writes anything.
func (a *API) authenticate(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, ok, err := apikey.Authenticate(r.Context(), a.pool, bearer(r))
	if err != nil {
		a.logger.ErrorContext(r.Context(), "authenticate", slog.String("error", err.Error()))
		writeError(w, http.StatusServiceUnavailable, "database_unavailable", "could not check the API key", "")
		return
	}
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="outflow"`)
		writeError(w, http.StatusUnauthorized, "unauthorized",
			"a valid API key is required: Authorization: Bearer <key>", "")
		return
	}
	if a.limits != nil {
		if ok, wait := a.limits.allow(key.ID); !ok {
			w.Header().Set("Retry-After", retryAfter(wait))
			writeError(w, http.StatusTooManyRequests, "rate_limited",
				"too many requests for this API key; retry after the number of seconds in Retry-After", "")
			return
		}
	}
	rec, _ := w.(*statusRecorder)
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, key)))
	// Only a request that succeeded counts as a use: a rejected request
	// changes nothing in the database.
	if rec != nil && rec.status < 400 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Second)
		defer cancel()
		if err := apikey.Touch(ctx, a.pool, key); err != nil {
			a.logger.WarnContext(ctx, "record api key use", slog.String("error", err.Error()))
		}
	}
}

// notFoundMerchant is the answer for a merchant the caller may not see:
// the one an unknown id gets, so that existence does not leak.
func notFoundMerchant(id string) error { return &app.NotFoundError{Entity: "merchant", ID: id} }

// notFoundPayment is notFoundMerchant for payments.
func notFoundPayment(id string) error { return &app.NotFoundError{Entity: "payment", ID: id} }

// mayActOn reports whether the caller may act on the merchant with that id
// (in any spelling the service accepts): an admin key on every merchant,
// a merchant's key on its own.
func mayActOn(ctx context.Context, merchantID string) bool {
	k, ok := principal(ctx)
	if !ok {
		return false
	}
	if k.Admin() {
		return true
	}
	// The service takes an id in the 36-character form only, in any case.
	u, err := uuid.Parse(merchantID)
	return err == nil && len(merchantID) == 36 && u.String() == k.MerchantID
}

// requireMerchant answers 404, as for an unknown merchant, when the caller
// may not act on the merchant the path names, and reports whether it may.
// Every /v1/merchants/{id}/... route calls it first.
func (a *API) requireMerchant(w http.ResponseWriter, r *http.Request) bool {
	id := r.PathValue("id")
	if mayActOn(r.Context(), id) {
		return true
	}
	a.writeAppError(w, r, notFoundMerchant(id))
	return false
}

// mayManageWebhooks is the webhook routes' authorization: the caller may
// act on the merchant (mayActOn) and the merchant exists, so that an
// admin key cannot make endpoints for an account that is no merchant
// (their deliveries would never come). A merchant's key names its own
// merchant, which exists; the look-up costs its requests nothing more
// than one indexed read. A failed look-up answers 404 too, logged.
func (a *API) mayManageWebhooks(r *http.Request, merchantID string) bool {
	if !mayActOn(r.Context(), merchantID) {
		return false
	}
	if !isAdmin(r.Context()) {
		return true
	}
	_, err := a.svc.GetMerchant(r.Context(), merchantID)
	if err != nil && !errors.As(err, new(*app.NotFoundError)) {
		a.logger.WarnContext(r.Context(), "look up merchant for its webhooks", slog.String("error", err.Error()))
	}
	return err == nil
}

// requireAdmin answers 404 to a merchant's key: the contract has a
// merchant's key see nothing beyond its own merchant, not even which
// endpoints exist.
func (a *API) requireAdmin(w http.ResponseWriter, r *http.Request) bool {
	if isAdmin(r.Context()) {
		return true
	}
	writeError(w, http.StatusNotFound, "not_found", "no such endpoint", "")
	return false
}

// requirePayment answers 404, as for an unknown payment, when a merchant's
// key names a payment of another merchant, and reports whether the request
// may go on. It runs before the command's transaction: a payment never
// changes merchant, so the answer cannot go stale, and the command does not
// hold a second connection while it reads.
func (a *API) requirePayment(w http.ResponseWriter, r *http.Request, id string) bool {
	if isAdmin(r.Context()) {
		return true
	}
	p, err := a.svc.GetPayment(r.Context(), id)
	if err == nil && !mayActOn(r.Context(), p.MerchantID) {
		err = notFoundPayment(p.ID)
	}
	if err != nil {
		a.writeAppError(w, r, err)
		return false
	}
	return true
}

// mayPayTo refuses a merchant's key a payment to another merchant with the
// error a merchant that does not exist gets.
func (a *API) mayPayTo(ctx context.Context, in app.NewPayment) error {
	if isAdmin(ctx) {
		return nil
	}
	if err := in.Validate(); err != nil {
		return err
	}
	if !mayActOn(ctx, in.MerchantID) {
		return &app.ValidationError{Field: "merchant_id", Message: "no such merchant"}
	}
	return nil
}
