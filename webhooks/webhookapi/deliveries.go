package webhookapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
)

// Attempts answers GET .../messages/{message}/attempts.
type Attempts struct {
	Data []deliveries.Attempt `json:"data"`
}

// Recovered answers POST .../recover: how many failed deliveries are to
// send again.
type Recovered struct {
	Recovered int `json:"recovered"`
}

// TestSent answers POST .../test: the test message's id (its webhook-id).
type TestSent struct {
	MessageID string `json:"message_id"`
}

// recoverBody is POST .../recover's body.
type recoverBody struct {
	// Since is RFC 3339: a string, parsed here so that a bad one is a 422
	// naming the field rather than a decoding error.
	Since *string `json:"since"`
}

// messageID returns the path's message id, answering 404 for one that is
// no message id (it is then no message, and no database error).
func messageID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("message")
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		writeNotFound(w, "webhook message "+id)
		return "", false
	}
	return u.String(), true
}

func badField(field, format string, args ...any) error {
	return &webhooks.ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// filter reads the messages route's query: status, event_type, before (a
// delivery id, the cursor) and limit; their ranges are the deliveries
// package's to check.
func filter(r *http.Request) (deliveries.Filter, error) {
	q := r.URL.Query()
	f := deliveries.Filter{Status: q.Get("status"), EventType: q.Get("event_type")}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return f, badField("before", "must be a cursor: the next_cursor of a page")
		}
		f.Before = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, badField("limit", "must be a positive integer")
		}
		f.Limit = n
	}
	return f, nil
}

// messages lists the endpoint's deliveries, newest first, a page at a
// time. The endpoint is looked up first: an unknown one is 404, not an
// empty page.
func (a *API) messages(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok || !noQuery(w, r, "status", "event_type", "before", "limit") {
		return
	}
	f, err := filter(r)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	ctx, id := r.Context(), r.PathValue("endpoint")
	if _, err := a.store.Get(ctx, a.pool, account, id); err != nil {
		a.writeError(w, r, err)
		return
	}
	page, err := deliveries.List(ctx, a.pool, account, id, f)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

func (a *API) attempts(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok || !noQuery(w, r) {
		return
	}
	msg, ok := messageID(w, r)
	if !ok {
		return
	}
	ctx, id := r.Context(), r.PathValue("endpoint")
	if _, err := a.store.Get(ctx, a.pool, account, id); err != nil {
		a.writeError(w, r, err)
		return
	}
	out, err := deliveries.Attempts(ctx, a.pool, account, id, msg)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if out == nil {
		out = []deliveries.Attempt{}
	}
	writeJSON(w, http.StatusOK, Attempts{Data: out})
}

// deliveryCommand is a command on one endpoint's deliveries: the endpoint
// is looked up first, in the command's transaction, so that an unknown
// one is 404 whatever the deliveries package answers for it. It answers
// 202: the sending is the sender's, later.
func (a *API) deliveryCommand(w http.ResponseWriter, r *http.Request, account string, in any,
	fn func(ctx context.Context, tx pgx.Tx, account, id string) (any, error),
) {
	id := r.PathValue("endpoint")
	a.run(w, r, in, http.StatusAccepted, true, func(ctx context.Context, tx pgx.Tx) (any, error) {
		if _, err := a.store.Get(ctx, tx, account, id); err != nil {
			return nil, err
		}
		return fn(ctx, tx, account, id)
	})
}

func (a *API) resend(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok {
		return
	}
	var in emptyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	msg, ok := messageID(w, r)
	if !ok {
		return
	}
	a.deliveryCommand(w, r, account, in, func(ctx context.Context, tx pgx.Tx, account, id string) (any, error) {
		return deliveries.Resend(ctx, tx, account, id, msg)
	})
}

// recoverSince sends again every delivery of the endpoint that failed
// since a time: at most MaxRecoverAge ago, and not in the future.
func (a *API) recoverSince(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok {
		return
	}
	var in recoverBody
	if !decodeBody(w, r, &in, true) {
		return
	}
	since, err := a.since(in.Since)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	a.deliveryCommand(w, r, account, in, func(ctx context.Context, tx pgx.Tx, account, id string) (any, error) {
		n, err := deliveries.Recover(ctx, tx, account, id, since)
		return Recovered{Recovered: n}, err
	})
}

func (a *API) since(s *string) (time.Time, error) {
	if s == nil || *s == "" {
		return time.Time{}, badField("since", "is required: the time (RFC 3339) from which failed deliveries are sent again")
	}
	t, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil {
		return time.Time{}, badField("since", "must be a time in RFC 3339 (2026-03-01T12:00:00Z)")
	}
	now := a.now()
	switch {
	case t.After(now):
		return time.Time{}, badField("since", "must not be in the future")
	case t.Before(now.Add(-a.maxRecover)):
		return time.Time{}, badField("since", "must be at most %s ago", a.maxRecover)
	}
	return t, nil
}

func (a *API) sendTest(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(w, r)
	if !ok {
		return
	}
	var in emptyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	a.deliveryCommand(w, r, account, in, func(ctx context.Context, tx pgx.Tx, account, id string) (any, error) {
		msg, err := deliveries.SendTest(ctx, tx, account, id)
		return TestSent{MessageID: msg}, err
	})
}
