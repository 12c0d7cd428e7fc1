package webhookapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
)

// Created answers POST /webhook_endpoints: the endpoint and its signing
// secret, shown this once.
type Created struct{ endpoints.Created }

// ShownOnce is the endpoint without its secret.
func (c Created) ShownOnce() any { return c.Endpoint }

// Rotated answers POST /webhook_endpoints/{endpoint}/secret/rotate: the
// new secret, shown this once, and until when the previous one signs too.
type Rotated struct{ endpoints.Rotated }

// ShownOnce is the rotation without the new secret.
func (r Rotated) ShownOnce() any {
	return struct {
		EndpointID              string     `json:"endpoint_id"`
		PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	}{r.EndpointID, r.PreviousSecretExpiresAt}
}

// List answers GET /webhook_endpoints.
type List struct {
	Data []endpoints.Endpoint `json:"data"`
}

// Deleted answers DELETE /webhook_endpoints/{endpoint}.
type Deleted struct {
	ID      string `json:"id"`
	Deleted bool   `json:"deleted"`
}

// emptyBody is the body of a command that takes none: {} or nothing.
type emptyBody struct{}

// noQuery refuses query parameters other than allowed, naming the first:
// a misspelt filter must not list everything.
func noQuery(w http.ResponseWriter, r *http.Request, allowed ...string) bool {
	q := r.URL.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(allowed, k) {
			writeError(w, http.StatusBadRequest, "unknown_field", k+": unknown query parameter", k)
			return false
		}
		if len(q[k]) > 1 {
			writeError(w, http.StatusBadRequest, "duplicate_field", k+": given twice", k)
			return false
		}
	}
	return true
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok {
		return
	}
	var in endpoints.NewEndpoint
	if !decodeBody(w, r, &in, true) {
		return
	}
	a.run(w, r, in, http.StatusCreated, false, func(ctx context.Context, tx pgx.Tx) (any, error) {
		c, err := a.store.Create(ctx, tx, account, in)
		return Created{c}, err
	})
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok || !noQuery(w, r) {
		return
	}
	out, err := a.store.List(r.Context(), a.pool, account)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, List{Data: out})
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok || !noQuery(w, r) {
		return
	}
	e, err := a.store.Get(r.Context(), a.pool, account, r.PathValue("endpoint"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

// optional is a PATCH field: absent, null, or a value.
type optional[T any] struct {
	Set, Null bool
	V         T
}

func (o *optional[T]) UnmarshalJSON(b []byte) error {
	o.Set = true
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		o.Null = true
		return nil
	}
	return json.Unmarshal(b, &o.V)
}

// patch is PATCH /webhook_endpoints/{endpoint}'s body: each field absent
// is left as it is; rate_limit null removes the limit; url, description
// and event_types may not be null (event_types [] is every type).
type patch struct {
	URL         optional[string]   `json:"url"`
	Description optional[string]   `json:"description"`
	EventTypes  optional[[]string] `json:"event_types"`
	RateLimit   optional[int]      `json:"rate_limit"`
}

func (p patch) update() (endpoints.Update, error) {
	var up endpoints.Update
	for _, f := range []struct {
		name string
		null bool
	}{{"url", p.URL.Null}, {"description", p.Description.Null}, {"event_types", p.EventTypes.Null}} {
		if f.null {
			msg := "must not be null"
			if f.name == "event_types" {
				msg += " (an empty list is every type)"
			}
			return up, &webhooks.ValidationError{Field: f.name, Message: msg}
		}
	}
	if p.URL.Set {
		up.URL = &p.URL.V
	}
	if p.Description.Set {
		up.Description = &p.Description.V
	}
	if p.EventTypes.Set {
		types := p.EventTypes.V
		if types == nil {
			types = []string{}
		}
		up.EventTypes = &types
	}
	switch {
	case p.RateLimit.Null:
		up.ClearRateLimit = true
	case p.RateLimit.Set:
		up.RateLimit = &p.RateLimit.V
	}
	return up, nil
}

// MarshalJSON gives an Idempotency-Key wrapper's hash the request as sent.
func (o optional[T]) MarshalJSON() ([]byte, error) {
	switch {
	case !o.Set:
		return []byte(`"<absent>"`), nil
	case o.Null:
		return []byte("null"), nil
	}
	return json.Marshal(o.V)
}

func (a *API) update(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok {
		return
	}
	var in patch
	if !decodeBody(w, r, &in, true) {
		return
	}
	up, err := in.update()
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	id := r.PathValue("endpoint")
	a.run(w, r, in, http.StatusOK, false, func(ctx context.Context, tx pgx.Tx) (any, error) {
		return a.store.Update(ctx, tx, account, id, up)
	})
}

func (a *API) delete(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok {
		return
	}
	var in emptyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	id := r.PathValue("endpoint")
	a.run(w, r, in, http.StatusOK, false, func(ctx context.Context, tx pgx.Tx) (any, error) {
		if err := a.store.Delete(ctx, tx, account, id); err != nil {
			return nil, err
		}
		return Deleted{ID: id, Deleted: true}, nil
	})
}

// endpointCommand is a command on one endpoint that takes no body.
func (a *API) endpointCommand(w http.ResponseWriter, r *http.Request, status int, wake bool,
	fn func(ctx context.Context, tx pgx.Tx, account, id string) (any, error),
) {
	account, ok := a.account(w, r)
	if !ok {
		return
	}
	var in emptyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	id := r.PathValue("endpoint")
	a.run(w, r, in, status, wake, func(ctx context.Context, tx pgx.Tx) (any, error) {
		return fn(ctx, tx, account, id)
	})
}

func (a *API) disable(w http.ResponseWriter, r *http.Request) {
	a.endpointCommand(w, r, http.StatusOK, false, func(ctx context.Context, tx pgx.Tx, account, id string) (any, error) {
		return a.store.Disable(ctx, tx, account, id)
	})
}

// enable wakes the sender: the deliveries that waited for the endpoint's
// circuit are due.
func (a *API) enable(w http.ResponseWriter, r *http.Request) {
	a.endpointCommand(w, r, http.StatusOK, true, func(ctx context.Context, tx pgx.Tx, account, id string) (any, error) {
		return a.store.Enable(ctx, tx, account, id)
	})
}

func (a *API) rotate(w http.ResponseWriter, r *http.Request) {
	a.endpointCommand(w, r, http.StatusOK, false, func(ctx context.Context, tx pgx.Tx, account, id string) (any, error) {
		out, err := a.store.RotateSecret(ctx, tx, account, id)
		return Rotated{out}, err
	})
}
