package deliveries

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
)

// ErrEndpointDisabled is returned by [Resend], [Recover] and [SendTest]
// for a disabled endpoint: nothing is sent to it until it is enabled
// again (then Recover sends what failed meanwhile). An API answers it
// with 409 Conflict: the request is right, the endpoint's state is not.
var ErrEndpointDisabled = errors.New("endpoint disabled")

// The statuses of a delivery.
const (
	StatusPending   = "pending"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
)

// Page sizes of [List].
const (
	DefaultLimit = 50
	MaxLimit     = 250
)

// MaxAttempts is how many attempts [Attempts] returns at most: the latest.
// A delivery makes about a dozen per schedule; only resends repeated
// hundreds of times come near it.
const MaxAttempts = 1000

// Delivery is one message's delivery to one endpoint, as an account sees it.
type Delivery struct {
	ID         int64  `json:"id"`
	MessageID  string `json:"message_id"`
	EndpointID string `json:"endpoint_id"`
	EventType  string `json:"event_type"`
	Status     string `json:"status"`
	// Attempts counts the attempts of the current schedule: a resend or
	// recovery starts it again from 0 (the earlier attempts stay listed).
	Attempts int `json:"attempts"`
	// NextAttemptAt is when the next attempt goes, for a pending delivery
	// only (the end of the current attempt's lease while one is in
	// flight).
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	LastError     string     `json:"last_error,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	SettledAt     *time.Time `json:"settled_at"`
}

// Attempt is one HTTP attempt of a delivery.
type Attempt struct {
	ID          int64     `json:"id"`
	AttemptedAt time.Time `json:"attempted_at"`
	// StatusCode is the response's, nil when there was none (a network
	// error, a timeout: see Error).
	StatusCode *int    `json:"status_code"`
	LatencyMS  float64 `json:"latency_ms"`
	// Error is the error's category, never the raw network error.
	Error string `json:"error,omitempty"`
	// ResponseBody is at most 1 KiB of the response's body, secrets
	// masked.
	ResponseBody string `json:"response_body,omitempty"`
	// LeaseLost marks an attempt whose sender had lost its lease when it
	// recorded it: the endpoint may have received it, but it decided
	// nothing.
	LeaseLost bool `json:"lease_lost,omitempty"`
}

// Filter narrows [List].
type Filter struct {
	// Status is "" (any), pending, delivered or failed.
	Status string
	// EventType is an exact event type; "" any.
	EventType string
	// Before is the cursor: the NextCursor of the previous page (a
	// delivery id); 0 starts from the newest.
	Before int64
	// Limit is the page's size: DefaultLimit when 0, at most MaxLimit.
	Limit int
}

func (f *Filter) validate() error {
	switch f.Status {
	case "", StatusPending, StatusDelivered, StatusFailed:
	default:
		return &webhooks.ValidationError{Field: "status", Message: "must be pending, delivered or failed"}
	}
	switch {
	case f.Limit == 0:
		f.Limit = DefaultLimit
	case f.Limit < 0 || f.Limit > MaxLimit:
		return &webhooks.ValidationError{Field: "limit", Message: "must be between 1 and " + strconv.Itoa(MaxLimit)}
	}
	if f.Before < 0 {
		return &webhooks.ValidationError{Field: "before", Message: "must be a cursor from a previous page"}
	}
	return nil
}

// Page is one page of [List], newest first.
type Page struct {
	Data []Delivery `json:"data"`
	// NextCursor is the Filter.Before of the next page; nil on the last.
	NextCursor *int64 `json:"next_cursor"`
}

// ids checks the ids an account passes: one that is not a uuid is no
// endpoint or message of its, not a bad request.
func ids(ids ...string) error {
	for _, id := range ids {
		if _, err := uuid.Parse(id); err != nil {
			return webhooks.ErrNotFound
		}
	}
	return nil
}

// deliveryColumns are what scanDelivery reads, from d (the delivery) and
// m (its message).
const deliveryColumns = `d.id, d.message_id::text, d.endpoint_id::text, m.event_type, d.status, d.attempts,
    d.next_attempt_at, coalesce(d.last_error, ''), d.created_at, d.settled_at`

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	var next time.Time
	if err := row.Scan(&d.ID, &d.MessageID, &d.EndpointID, &d.EventType, &d.Status, &d.Attempts,
		&next, &d.LastError, &d.CreatedAt, &d.SettledAt); err != nil {
		return Delivery{}, err
	}
	if d.Status == StatusPending {
		d.NextAttemptAt = &next
	}
	return d, nil
}

// List returns the deliveries of endpointID, an endpoint of account,
// newest first (by creation, then id), a page at a time.
//
// The order is the endpoint index's (endpoint_id, created_at), so that a
// page costs its own rows however deep the cursor, and the cursor is the
// last delivery's id, whose creation time it looks up: a delivery purged
// meanwhile makes the next page continue by id alone.
func List(ctx context.Context, db webhooks.DB, account, endpointID string, f Filter) (Page, error) {
	if err := f.validate(); err != nil {
		return Page{}, err
	}
	if err := ids(endpointID); err != nil {
		return Page{}, err
	}
	var cursorAt *time.Time
	err := db.QueryRow(ctx, `SELECT (SELECT created_at FROM webhook_endpoint_deliveries WHERE id = $3 AND endpoint_id = e.id)
		FROM webhook_endpoints e WHERE e.id = $1 AND e.account_id = $2`, endpointID, account, f.Before).Scan(&cursorAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Page{}, webhooks.ErrNotFound
	}
	if err != nil {
		return Page{}, fmt.Errorf("list webhook deliveries: %w", err)
	}
	// The conditions that apply only: a plan per shape, each with its
	// bounds in the index scan.
	where := []string{"d.endpoint_id = $1"}
	args := []any{endpointID}
	arg := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if f.Status != "" {
		arg("d.status = ?", f.Status)
	}
	if f.EventType != "" {
		arg("m.event_type = ?", f.EventType)
	}
	switch {
	case cursorAt != nil:
		arg("d.created_at <= ?", *cursorAt)
		arg("(d.created_at, d.id) < ("+"$"+strconv.Itoa(len(args))+", ?)", f.Before)
	case f.Before > 0:
		arg("d.id < ?", f.Before)
	}
	args = append(args, f.Limit+1)
	q := `SELECT ` + deliveryColumns + `
		FROM webhook_endpoint_deliveries d JOIN webhook_messages m ON m.id = d.message_id
		WHERE ` + strings.Join(where, " AND ") + `
		ORDER BY d.created_at DESC, d.id DESC LIMIT $` + strconv.Itoa(len(args))
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return Page{}, fmt.Errorf("list webhook deliveries: %w", err)
	}
	data, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) { return scanDelivery(r) })
	if err != nil {
		return Page{}, fmt.Errorf("list webhook deliveries: %w", err)
	}
	p := Page{Data: data}
	if p.Data == nil {
		p.Data = []Delivery{} // "data": [], not null
	}
	if len(p.Data) > f.Limit {
		p.Data = p.Data[:f.Limit]
		next := p.Data[f.Limit-1].ID
		p.NextCursor = &next
	}
	return p, nil
}

// get reads the delivery of messageID to endpointID, an endpoint of
// account.
func get(ctx context.Context, db webhooks.DB, account, endpointID, messageID string) (Delivery, error) {
	d, err := scanDelivery(db.QueryRow(ctx, `SELECT `+deliveryColumns+`
		FROM webhook_endpoint_deliveries d
		JOIN webhook_messages m ON m.id = d.message_id
		JOIN webhook_endpoints e ON e.id = d.endpoint_id
		WHERE d.endpoint_id = $1 AND d.message_id = $2 AND e.account_id = $3`, endpointID, messageID, account))
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, webhooks.ErrNotFound
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("read webhook delivery: %w", err)
	}
	return d, nil
}

// Attempts returns the attempts of the delivery of messageID to
// endpointID, an endpoint of account, newest first (at most
// [MaxAttempts]); none for a delivery not tried yet.
func Attempts(ctx context.Context, db webhooks.DB, account, endpointID, messageID string) ([]Attempt, error) {
	if err := ids(endpointID, messageID); err != nil {
		return nil, err
	}
	// The delivery joined left: a delivery without attempts is one row
	// of NULLs, no delivery is no row.
	rows, err := db.Query(ctx, `SELECT a.id, a.attempted_at, a.status_code, a.latency_ms, coalesce(a.error, ''),
			coalesce(a.response_body, ''), a.lease_lost
		FROM webhook_endpoint_deliveries d
		JOIN webhook_endpoints e ON e.id = d.endpoint_id
		LEFT JOIN LATERAL (SELECT * FROM webhook_endpoint_attempts a WHERE a.delivery_id = d.id
			ORDER BY a.attempted_at DESC, a.id DESC LIMIT $4) a ON true
		WHERE d.endpoint_id = $1 AND d.message_id = $2 AND e.account_id = $3
		ORDER BY a.attempted_at DESC, a.id DESC`, endpointID, messageID, account, MaxAttempts)
	if err != nil {
		return nil, fmt.Errorf("list webhook attempts: %w", err)
	}
	type row struct {
		ID          *int64
		AttemptedAt *time.Time
		StatusCode  *int
		LatencyMS   *float64
		Error       string
		Body        string
		LeaseLost   *bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return nil, fmt.Errorf("list webhook attempts: %w", err)
	}
	if len(got) == 0 {
		return nil, webhooks.ErrNotFound
	}
	out := make([]Attempt, 0, len(got))
	for _, r := range got {
		if r.ID == nil {
			continue // the delivery, not tried yet
		}
		out = append(out, Attempt{ID: *r.ID, AttemptedAt: *r.AttemptedAt, StatusCode: r.StatusCode,
			LatencyMS: *r.LatencyMS, Error: r.Error, ResponseBody: r.Body, LeaseLost: *r.LeaseLost})
	}
	return out, nil
}

// restart is what a resend or a recovery does to a delivery: pending,
// due now (at the circuit's end while the endpoint's is open, as
// fanout.Enqueue does, so the due scan keeps skipping it), a schedule of
// its own from attempt 0, the lease and the settled state cleared. A
// lapsed lease's token goes too: its sender's late result is then
// recorded as lease_lost and decides nothing.
const restart = `status = 'pending', attempts = 0, next_attempt_at = greatest(now(), e.circuit_open_until),
    lease_token = NULL, last_error = NULL, settled_at = NULL, suspect = e.consecutive_failures > 0`

// inFlight is true of a delivery whose attempt is under way: leased, and
// the lease not lapsed. Those are left alone.
const inFlight = `(d.status = 'pending' AND d.lease_token IS NOT NULL AND d.next_attempt_at > now())`

// endpointLocked selects endpoint $1 of account $2, locked against a
// change of its state (a disable by the sender) until the statement's
// transaction ends: its disabled_at is the latest, and a disable waits
// for the deliveries this statement makes pending, which it then fails.
const endpointLocked = `SELECT id, disabled_at, circuit_open_until, consecutive_failures FROM webhook_endpoints
    WHERE id = $1 AND account_id = $2 FOR SHARE`

// Resend sends the message messageID to endpointID, an endpoint of
// account, again now: its delivery becomes pending with its schedule
// restarted, whatever its status (a delivered one too: the account asked
// for it). A delivery in flight (leased) is left to its attempt: Resend
// returns its current state, and the attempt's outcome decides it. It
// returns the delivery; [webhooks.ErrNotFound] when the endpoint is not
// the account's or the message was never to be delivered to it,
// [ErrEndpointDisabled] while the endpoint is disabled.
func Resend(ctx context.Context, db webhooks.DB, account, endpointID, messageID string) (Delivery, error) {
	if err := ids(endpointID, messageID); err != nil {
		return Delivery{}, err
	}
	var disabled *bool
	if err := db.QueryRow(ctx, `WITH e AS (`+endpointLocked+`), upd AS (
		    UPDATE webhook_endpoint_deliveries d SET `+restart+`
		    FROM e
		    WHERE d.endpoint_id = e.id AND d.message_id = $3 AND e.disabled_at IS NULL AND NOT `+inFlight+`
		    RETURNING d.id
		)
		SELECT (SELECT disabled_at IS NOT NULL FROM e)`,
		endpointID, account, messageID).Scan(&disabled); err != nil {
		return Delivery{}, fmt.Errorf("resend webhook %s: %w", messageID, err)
	}
	switch {
	case disabled == nil:
		return Delivery{}, webhooks.ErrNotFound
	case *disabled:
		return Delivery{}, ErrEndpointDisabled
	}
	// Resent, or in flight (then as it is), or none. (A data-modifying
	// WITH runs whether or not the query reads it.)
	return get(ctx, db, account, endpointID, messageID)
}

// Recover sends again every delivery to endpointID, an endpoint of
// account, that failed and was created at or after since: each becomes
// pending with its schedule restarted, as [Resend] does. It returns how
// many; [ErrEndpointDisabled] while the endpoint is disabled (enable it,
// then recover what failed while it was: its pending deliveries were
// failed when it was disabled).
func Recover(ctx context.Context, db webhooks.DB, account, endpointID string, since time.Time) (int, error) {
	if err := ids(endpointID); err != nil {
		return 0, err
	}
	var (
		disabled *bool
		n        int
	)
	if err := db.QueryRow(ctx, `WITH e AS (`+endpointLocked+`), upd AS (
		    UPDATE webhook_endpoint_deliveries d SET `+restart+`
		    FROM e
		    WHERE d.endpoint_id = e.id AND d.status = 'failed' AND d.created_at >= $3 AND e.disabled_at IS NULL
		    RETURNING d.id
		)
		SELECT (SELECT disabled_at IS NOT NULL FROM e), (SELECT count(*) FROM upd)`,
		endpointID, account, since).Scan(&disabled, &n); err != nil {
		return 0, fmt.Errorf("recover webhooks of endpoint %s: %w", endpointID, err)
	}
	switch {
	case disabled == nil:
		return 0, webhooks.ErrNotFound
	case *disabled:
		return 0, ErrEndpointDisabled
	}
	return n, nil
}

// TestMessage is the message of a test event's data.
const TestMessage = "This is a test event: your endpoint receives the account's webhooks."

// SendTest sends a test event ([webhooks.EventTest], data
// [webhooks.TestEvent]) to endpointID, an endpoint of account, and to no
// other, whatever the endpoint's event-type filter. It returns the
// message's id (the webhook-id the endpoint receives, and what
// [Attempts] takes); [ErrEndpointDisabled] while the endpoint is
// disabled.
func SendTest(ctx context.Context, db webhooks.DB, account, endpointID string) (messageID string, err error) {
	if err := ids(endpointID); err != nil {
		return "", err
	}
	var disabled bool
	err = db.QueryRow(ctx, `SELECT disabled_at IS NOT NULL FROM webhook_endpoints WHERE id = $1 AND account_id = $2`,
		endpointID, account).Scan(&disabled)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", webhooks.ErrNotFound
	case err != nil:
		return "", fmt.Errorf("send test webhook: %w", err)
	case disabled:
		return "", ErrEndpointDisabled
	}
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("send test webhook: %w", err)
	}
	data, err := json.Marshal(webhooks.TestEvent{EndpointID: endpointID, Message: TestMessage})
	if err != nil {
		return "", fmt.Errorf("send test webhook: %w", err)
	}
	m := webhooks.Message{ID: id.String(), AccountID: account, EventType: webhooks.EventTest,
		OccurredAt: time.Now().UTC(), SchemaVersion: 1, Payload: data}
	r, err := fanout.Enqueue(ctx, db, m, fanout.Target{Endpoints: []string{endpointID}, AllTypes: true},
		events.Traceparent(ctx))
	switch {
	case err != nil:
		return "", fmt.Errorf("send test webhook: %w", err)
	case !r.Recorded: // deleted since the check
		return "", webhooks.ErrNotFound
	case r.Pending == 0: // disabled since the check: recorded failed, as for any message
		return m.ID, ErrEndpointDisabled
	}
	return m.ID, nil
}
