package fanout

import (
	"context"
	"errors"
	"fmt"

	"github.com/outflow-dev/outflow/webhooks"
)

// Target narrows which of the account's endpoints a message goes to.
type Target struct {
	// Endpoints, when not empty, restricts the message to these endpoint
	// ids (a test event). Such a message is not held behind a failing
	// endpoint's retry: the account asked for it now. An open circuit
	// still holds it.
	Endpoints []string
	// Except leaves one endpoint out (the one an endpoint.disabled
	// notice is about).
	Except string
	// AllTypes sends to endpoints whatever their event-type filter (the
	// package's own notices and test events).
	AllTypes bool
}

// Result says what Enqueue recorded.
type Result struct {
	// Recorded is false when the message was recorded before (a
	// redelivered event: nothing more was done) or no endpoint wants it
	// (nothing is stored).
	Recorded bool
	// Pending is how many deliveries are to send: the matching enabled
	// endpoints. A disabled endpoint's delivery is recorded as failed
	// ("endpoint disabled"), so that recovering the endpoint sends it.
	Pending int
}

// enqueueSQL records message $1 of account $2 and its deliveries, once:
// nothing when the message id is already there or no endpoint matches. An
// endpoint matches when its filter is empty, lists the type, or holds a
// prefix ending in ".*" the type starts with. A delivery to an endpoint
// whose circuit is open, or whose backlog waits for a retry's outcome
// (held_until), waits as long, outside the due scan; one to an endpoint
// whose last attempt failed is in the suspect lane's.
const enqueueSQL = `
WITH targets AS (
    SELECT e.id, e.disabled_at, e.circuit_open_until, e.held_until, e.consecutive_failures FROM webhook_endpoints e
    WHERE e.account_id = $2
      AND (cardinality($8::uuid[]) = 0 OR e.id = ANY ($8::uuid[]))
      AND e.id IS DISTINCT FROM $9::uuid
      AND ($10 OR cardinality(e.event_types) = 0 OR $3 = ANY (e.event_types)
           OR EXISTS (SELECT 1 FROM unnest(e.event_types) t
                      WHERE right(t, 2) = '.*' AND starts_with($3, left(t, -1))))
), msg AS (
    INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, schema_version, payload, traceparent)
    SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM targets)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), ins AS (
    INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, next_attempt_at, last_error, settled_at, suspect)
    SELECT msg.id, t.id,
           CASE WHEN t.disabled_at IS NULL THEN 'pending' ELSE 'failed' END,
           greatest(now(), t.circuit_open_until, CASE WHEN cardinality($8::uuid[]) = 0 THEN t.held_until END),
           CASE WHEN t.disabled_at IS NOT NULL THEN 'endpoint disabled' END,
           CASE WHEN t.disabled_at IS NOT NULL THEN now() END,
           t.consecutive_failures > 0
    FROM msg, targets t
    RETURNING status
)
SELECT EXISTS (SELECT 1 FROM msg), (SELECT count(*) FROM ins WHERE status = 'pending')`

// Enqueue records m for its account's endpoints that want it (see Target)
// on db, which should be the caller's transaction. Recording an id twice
// does nothing the second time.
func Enqueue(ctx context.Context, db webhooks.DB, m webhooks.Message, to Target, traceparent string) (Result, error) {
	switch {
	case m.ID == "":
		return Result{}, errors.New("enqueue webhook: message id is required")
	case m.AccountID == "":
		return Result{}, errors.New("enqueue webhook: account id is required")
	case m.EventType == "":
		return Result{}, errors.New("enqueue webhook: event type is required")
	}
	sv := m.SchemaVersion
	if sv == 0 {
		sv = 1
	}
	payload := []byte(m.Payload)
	if payload == nil {
		payload = []byte("null")
	}
	var except *string
	if to.Except != "" {
		except = &to.Except
	}
	endpoints := to.Endpoints
	if endpoints == nil {
		endpoints = []string{}
	}
	var r Result
	var pending int64
	if err := db.QueryRow(ctx, enqueueSQL, m.ID, m.AccountID, m.EventType, m.OccurredAt, sv, payload, traceparent,
		endpoints, except, to.AllTypes).Scan(&r.Recorded, &pending); err != nil {
		return Result{}, fmt.Errorf("enqueue webhook %s: %w", m.ID, err)
	}
	r.Pending = int(pending)
	return r, nil
}
