package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
)

// The webhook endpoints' pages and actions. An operator acts for every
// account: the console looks an endpoint's account up by its id, then
// calls the webhooks packages with that account, as the account's own API
// would (the same checks, the same statements). Every action goes through
// the console's action mechanism: a confirmation, the CSRF token, and its
// record in outflow_operator_actions in the transaction of the change.

// endpointStore is the console's endpoints.Store: disable and enable need
// no secret key (they never read a secret), nor any of its other settings.
var endpointStore = func() *endpoints.Store {
	s, err := endpoints.New(endpoints.Config{})
	if err != nil {
		panic(err) // the zero Config is valid
	}
	return s
}()

// webhookTarget is what the record of a webhook action names.
type webhookTarget struct {
	AccountID  string `json:"account_id"`
	EndpointID string `json:"endpoint_id"`
	MessageID  string `json:"message_id,omitempty"`
	Since      string `json:"since,omitempty"`
}

// badInput is a request the console refuses before it reads or changes
// anything: its status and the field it names.
type badInput struct {
	status int
	field  string
	msg    string
}

func (b *badInput) Error() string { return b.field + ": " + b.msg }

// endpointInfo is an endpoint as the console shows it: its settings
// (never its secret, which endpoints.Endpoint has no field for) and the
// sender's health record.
type endpointInfo struct {
	endpoints.Endpoint
	ConsecutiveFailures int
	CircuitOpenUntil    *time.Time
}

// CircuitOpen says whether the circuit is open now.
func (e endpointInfo) CircuitOpen(now time.Time) bool {
	return e.CircuitOpenUntil != nil && e.CircuitOpenUntil.After(now)
}

// endpointOf reads the endpoint the path's {id} names, of whichever
// account: its account by the primary key, then the endpoint through
// endpoints.Store.Get with it, as the account's API reads it. An id that
// is not a uuid is a 400, an unknown one a 404, both naming "endpoint".
func (c *Console) endpointOf(ctx context.Context, r *http.Request) (endpointInfo, error) {
	raw := r.PathValue("id")
	id, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		return endpointInfo{}, &badInput{http.StatusBadRequest, "endpoint", fmt.Sprintf("%q is not an endpoint id (a uuid)", raw)}
	}
	var info endpointInfo
	err = c.cfg.Pool.QueryRow(ctx, `SELECT account_id, consecutive_failures, circuit_open_until FROM webhook_endpoints WHERE id = $1`,
		id).Scan(&info.AccountID, &info.ConsecutiveFailures, &info.CircuitOpenUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return endpointInfo{}, &badInput{http.StatusNotFound, "endpoint", "no endpoint " + id.String()}
	}
	if err != nil {
		return endpointInfo{}, fmt.Errorf("read webhook endpoint %s: %w", id, err)
	}
	info.Endpoint, err = endpointStore.Get(ctx, c.cfg.Pool, info.AccountID, id.String())
	if errors.Is(err, webhooks.ErrNotFound) { // deleted meanwhile
		return endpointInfo{}, &badInput{http.StatusNotFound, "endpoint", "no endpoint " + id.String()}
	}
	if err != nil {
		return endpointInfo{}, err
	}
	return info, nil
}

// refuse answers err: a badInput with its status, naming its field; a
// missing webhooks set with 404; anything else as a failure.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if b := (*badInput)(nil); errors.As(err, &b) {
		http.Error(w, b.Error(), b.status)
		return
	}
	c.fail(w, r, err)
}

// needWebhooks answers 404 when the webhooks set is not installed, and
// says whether the request may go on.
func (c *Console) needWebhooks(w http.ResponseWriter, r *http.Request) bool {
	ok, err := c.webhooksInstalled(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return false
	}
	if !ok {
		http.Error(w, "webhooks not installed: the webhooks migration set is not in this database", http.StatusNotFound)
	}
	return ok
}

// endpointPage is GET /webhooks/endpoints/{id}.
type endpointPage struct {
	Endpoint endpointInfo
	Now      time.Time
	Messages deliveries.Page
	Status   string
	// OlderHref is the next page of messages; "" on the last.
	OlderHref, NewestHref string
	// Message is the message whose attempts are shown (message=), with
	// its delivery's state; "" for none.
	Message  string
	Delivery *deliveries.Delivery
	Attempts []deliveries.Attempt
}

func (c *Console) endpointPage(w http.ResponseWriter, r *http.Request, s session) {
	if !c.needWebhooks(w, r) {
		return
	}
	ctx := r.Context()
	info, err := c.endpointOf(ctx, r)
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	q := r.URL.Query()
	ep := endpointPage{Endpoint: info, Now: c.now(), Status: q.Get("status"), Message: q.Get("message")}
	f := deliveries.Filter{Status: ep.Status, Limit: c.cfg.PageSize}
	if v := q.Get("before"); v != "" {
		if f.Before, err = strconv.ParseInt(v, 10, 64); err != nil || f.Before <= 0 {
			http.Error(w, fmt.Sprintf("before: %q is not a cursor of this list", v), http.StatusBadRequest)
			return
		}
	}
	base := "/webhooks/endpoints/" + info.ID
	ep.Messages, err = deliveries.List(ctx, c.cfg.Pool, info.AccountID, info.ID, f)
	if ve := (*webhooks.ValidationError)(nil); errors.As(err, &ve) {
		http.Error(w, ve.Error(), http.StatusBadRequest)
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	keep := url.Values{}
	if ep.Status != "" {
		keep.Set("status", ep.Status)
	}
	if ep.Messages.NextCursor != nil {
		older := url.Values{"before": {strconv.FormatInt(*ep.Messages.NextCursor, 10)}}
		if ep.Status != "" {
			older.Set("status", ep.Status)
		}
		ep.OlderHref = base + "?" + older.Encode()
	}
	if f.Before != 0 {
		ep.NewestHref = base
		if len(keep) > 0 {
			ep.NewestHref += "?" + keep.Encode()
		}
	}
	if ep.Message != "" {
		if _, err := uuid.Parse(ep.Message); err != nil {
			http.Error(w, fmt.Sprintf("message: %q is not a message id (a uuid)", ep.Message), http.StatusBadRequest)
			return
		}
		ep.Attempts, err = deliveries.Attempts(ctx, c.cfg.Pool, info.AccountID, info.ID, ep.Message)
		if errors.Is(err, webhooks.ErrNotFound) {
			http.Error(w, "message: no delivery of message "+ep.Message+" to this endpoint", http.StatusNotFound)
			return
		}
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d, err := c.deliveryOf(ctx, info.ID, ep.Message)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		ep.Delivery = &d
	}
	p := c.pageFor(s, "Webhook endpoint")
	if p.Result, err = c.doneAction(r); err != nil {
		c.fail(w, r, err)
		return
	}
	p.Data = ep
	c.render(w, http.StatusOK, "endpoint", p)
}

// deliveryOf reads the delivery of message to endpoint, by the table's
// (message_id, endpoint_id) key.
func (c *Console) deliveryOf(ctx context.Context, endpoint, message string) (deliveries.Delivery, error) {
	var d deliveries.Delivery
	var next time.Time
	err := c.cfg.Pool.QueryRow(ctx, `SELECT d.id, d.message_id::text, d.endpoint_id::text, m.event_type, d.status, d.attempts,
		    d.next_attempt_at, coalesce(d.last_error, ''), d.created_at, d.settled_at
		FROM webhook_endpoint_deliveries d JOIN webhook_messages m ON m.id = d.message_id
		WHERE d.message_id = $1 AND d.endpoint_id = $2`, message, endpoint).Scan(&d.ID, &d.MessageID, &d.EndpointID,
		&d.EventType, &d.Status, &d.Attempts, &next, &d.LastError, &d.CreatedAt, &d.SettledAt)
	if err != nil {
		return d, fmt.Errorf("read webhook delivery: %w", err)
	}
	if d.Status == deliveries.StatusPending {
		d.NextAttemptAt = &next
	}
	return d, nil
}

// accountPage is GET /webhooks/accounts/{account}: the account's
// endpoints, each with its state and a link to its page.
type accountPage struct {
	Account   string
	Endpoints []endpointInfo
	Now       time.Time
}

func (c *Console) accountPage(w http.ResponseWriter, r *http.Request, s session) {
	if !c.needWebhooks(w, r) {
		return
	}
	account := r.PathValue("account")
	if account == "" || len(account) > maxAccount {
		http.Error(w, errBadAccount.Error()+" and not empty", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	rows, err := c.cfg.Pool.Query(ctx, `SELECT id::text, consecutive_failures, circuit_open_until FROM webhook_endpoints
		WHERE account_id = $1 ORDER BY created_at, id LIMIT $2`, account, endpoints.ListLimit)
	if err != nil {
		c.fail(w, r, fmt.Errorf("list webhook endpoints: %w", err))
		return
	}
	type health struct {
		ID       string
		Failures int
		Circuit  *time.Time
	}
	hs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[health])
	if err != nil {
		c.fail(w, r, fmt.Errorf("list webhook endpoints: %w", err))
		return
	}
	list, err := endpointStore.List(ctx, c.cfg.Pool, account)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if len(list) == 0 {
		http.Error(w, "account: no webhook endpoint of account "+account, http.StatusNotFound)
		return
	}
	byID := map[string]health{}
	for _, h := range hs {
		byID[h.ID] = h
	}
	ap := accountPage{Account: account, Now: c.now()}
	for _, e := range list {
		h := byID[e.ID]
		ap.Endpoints = append(ap.Endpoints, endpointInfo{Endpoint: e, ConsecutiveFailures: h.Failures, CircuitOpenUntil: h.Circuit})
	}
	p := c.pageFor(s, "Webhook endpoints of "+account)
	p.Data = ap
	c.render(w, http.StatusOK, "account", p)
}

// parseSince reads a recovery's since: RFC 3339, or the
// "2006-01-02T15:04" of a datetime-local input, read as UTC. It must not
// be in the future.
func parseSince(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, &badInput{http.StatusBadRequest, "since", "required: the time from which failed deliveries are sent again"}
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04"} {
		if t, err := time.Parse(layout, v); err == nil {
			if t.After(now) {
				return time.Time{}, &badInput{http.StatusBadRequest, "since", "must not be in the future"}
			}
			return t.UTC(), nil
		}
	}
	return time.Time{}, &badInput{http.StatusBadRequest, "since", fmt.Sprintf("%q is not a time (RFC 3339, or 2006-01-02T15:04 in UTC)", v)}
}

// endpointAction is one action on an endpoint: its name in the audit,
// its button, what it does, and do, which runs in the action's
// transaction and returns how many deliveries or endpoints it changed.
type endpointAction struct {
	name, verb, what string
	danger           bool
	// prepare checks the form and fills the target; it changes nothing.
	prepare func(ctx context.Context, r *http.Request, info endpointInfo, t *webhookTarget) error
	do      func(ctx context.Context, tx pgx.Tx, t webhookTarget) (int64, error)
}

// endpointAct runs a through the console's action mechanism, as the
// parked rows' and dead letters' actions: without confirm=yes the
// confirmation, with it the change and its record in one transaction
// (a change refused by the webhooks package, a disabled endpoint say, is
// recorded with its error and shown on the page it returns to).
func (c *Console) endpointAct(a endpointAction) func(http.ResponseWriter, *http.Request, session) {
	return func(w http.ResponseWriter, r *http.Request, s session) {
		if !c.needWebhooks(w, r) {
			return
		}
		ctx := r.Context()
		info, err := c.endpointOf(ctx, r)
		if err != nil {
			c.refuse(w, r, err)
			return
		}
		t := webhookTarget{AccountID: info.AccountID, EndpointID: info.ID}
		if a.prepare != nil {
			if err := a.prepare(ctx, r, info, &t); err != nil {
				c.refuse(w, r, err)
				return
			}
		}
		if t.MessageID != "" {
			if _, err := c.deliveryOf(ctx, info.ID, t.MessageID); errors.Is(err, pgx.ErrNoRows) {
				http.Error(w, "message: no delivery of message "+t.MessageID+" to this endpoint", http.StatusNotFound)
				return
			} else if err != nil {
				c.fail(w, r, err)
				return
			}
		}
		back := "/webhooks/endpoints/" + info.ID
		if t.MessageID != "" {
			back += "?" + url.Values{"message": {t.MessageID}}.Encode()
		}
		question := fmt.Sprintf("%s: endpoint %s of account %s?", a.verb, info.URL, info.AccountID)
		cd := confirmData{What: a.what, Back: back, All: true, Danger: a.danger, Button: a.verb, Question: question}
		c.confirmThenDo(w, r, s, cd, func(ctx context.Context) (int64, error) {
			id, _, err := c.inTx(ctx, s, a.name, t, func(ctx context.Context, tx pgx.Tx) (int64, error) { return a.do(ctx, tx, t) })
			return id, err
		})
	}
}

// The endpoint actions.
var (
	webhookResend = endpointAction{name: "webhook.resend", verb: "Resend the message",
		what: "Send the message to this endpoint again now: its delivery becomes pending with its schedule restarted (a delivery in flight is left to its attempt).",
		prepare: func(ctx context.Context, r *http.Request, info endpointInfo, t *webhookTarget) error {
			m := r.PostFormValue("message")
			if _, err := uuid.Parse(m); err != nil || len(m) != 36 {
				return &badInput{http.StatusBadRequest, "message", fmt.Sprintf("%q is not a message id (a uuid)", m)}
			}
			t.MessageID = m
			return nil
		},
		do: func(ctx context.Context, tx pgx.Tx, t webhookTarget) (int64, error) {
			if _, err := deliveries.Resend(ctx, tx, t.AccountID, t.EndpointID, t.MessageID); err != nil {
				return 0, err
			}
			return 1, nil
		}}
	webhookRecover = endpointAction{name: "webhook.recover", verb: "Recover failed deliveries",
		what: "Send again every delivery to this endpoint that failed and was created at or after the time given: each becomes pending with its schedule restarted.",
		do: func(ctx context.Context, tx pgx.Tx, t webhookTarget) (int64, error) {
			since, err := time.Parse(time.RFC3339Nano, t.Since)
			if err != nil {
				return 0, err
			}
			n, err := deliveries.Recover(ctx, tx, t.AccountID, t.EndpointID, since)
			return int64(n), err
		}}
	webhookTest = endpointAction{name: "webhook.test", verb: "Send a test event",
		what: "Send a test event (" + webhooks.EventTest + ") to this endpoint only, whatever its event types.",
		do: func(ctx context.Context, tx pgx.Tx, t webhookTarget) (int64, error) {
			if _, err := deliveries.SendTest(ctx, tx, t.AccountID, t.EndpointID); err != nil {
				return 0, err
			}
			return 1, nil
		}}
	webhookDisable = endpointAction{name: "webhook.disable", verb: "Disable the endpoint", danger: true,
		what: "Disable the endpoint: nothing more is sent to it, and its pending deliveries fail at once (\"endpoint disabled\"); enable it, then recover, to send them.",
		do: func(ctx context.Context, tx pgx.Tx, t webhookTarget) (int64, error) {
			if _, err := endpointStore.Disable(ctx, tx, t.AccountID, t.EndpointID); err != nil {
				return 0, err
			}
			return 1, nil
		}}
	webhookEnable = endpointAction{name: "webhook.enable", verb: "Enable the endpoint",
		what: "Enable the endpoint with a clean health record (no failing run, circuit closed). It resends nothing: recover what failed meanwhile.",
		do: func(ctx context.Context, tx pgx.Tx, t webhookTarget) (int64, error) {
			if _, err := endpointStore.Enable(ctx, tx, t.AccountID, t.EndpointID); err != nil {
				return 0, err
			}
			return 1, nil
		}}
)

// recoverAction is webhookRecover with its since read against the
// console's clock.
func (c *Console) recoverAction() endpointAction {
	a := webhookRecover
	a.prepare = func(ctx context.Context, r *http.Request, info endpointInfo, t *webhookTarget) error {
		since, err := parseSince(r.PostFormValue("since"), c.now())
		if err != nil {
			return err
		}
		t.Since = since.Format(time.RFC3339Nano)
		return nil
	}
	return a
}

// endpointState is an endpoint's state in a word, for its pages.
type endpointState struct {
	Name, Class, Text string
}

func endpointStateOf(e endpointInfo, now time.Time) endpointState {
	switch {
	case e.Disabled && e.DisabledReason == "failing":
		return endpointState{"disabled", "bad", "disabled (failing for too long)"}
	case e.Disabled:
		return endpointState{"disabled", "bad", "disabled (" + e.DisabledReason + ")"}
	case e.CircuitOpen(now):
		return endpointState{"circuit-open", "warn", "circuit open"}
	case e.FailingSince != nil:
		return endpointState{"failing", "warn", fmt.Sprintf("failing (%d in a row)", e.ConsecutiveFailures)}
	}
	return endpointState{"enabled", "", "enabled"}
}
