package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
)

// createdMerchant is the answer to POST /v1/merchants: the merchant, its
// webhook secret and its first API key.
type createdMerchant struct {
	app.CreatedMerchant
	APIKey string `json:"api_key"`
}

// replay leaves the API key and the webhook secret out of the response
// stored for an Idempotency-Key: both are shown once, and the database
// never keeps either in plaintext in a stored response.
func (m createdMerchant) replay() any { return m.Merchant }

// createdKey is the answer to POST /v1/merchants/{id}/api_keys.
type createdKey struct{ apikey.Created }

func (k createdKey) replay() any { return k.Key }

type newKeyBody struct {
	Name string `json:"name"`
}

// createMerchantKey makes another API key for a merchant: an admin may,
// and so may the merchant's own keys (to rotate: make one, switch, revoke
// the old one with `outflow apikey revoke`).
func (a *API) createMerchantKey(w http.ResponseWriter, r *http.Request) {
	if !a.requireMerchant(w, r) {
		return
	}
	var in newKeyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	id := r.PathValue("id")
	if err := apikey.ValidateName(in.Name); err != nil {
		a.writeAppError(w, r, &app.ValidationError{Field: "name", Message: strings.TrimPrefix(err.Error(), apikey.ErrInvalidName.Error()+": ")})
		return
	}
	a.command(w, r, in, http.StatusCreated, func(ctx context.Context, tx pgx.Tx) (any, error) {
		u, err := uuid.Parse(id)
		if err != nil || len(id) != 36 {
			return nil, notFoundMerchant(id)
		}
		k, err := apikey.Create(ctx, tx, apikey.New{Name: in.Name, MerchantID: u.String()})
		if errors.Is(err, apikey.ErrUnknownMerchant) {
			return nil, notFoundMerchant(u.String())
		}
		if err != nil {
			return nil, err
		}
		return createdKey{k}, nil
	})
}
