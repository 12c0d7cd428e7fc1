package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/webhooks/signing"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// NotifyConfig configures NotifyMerchant and the webhook [Sender].
type NotifyConfig struct {
	// Client sends the webhooks. Defaults to an http.Client keeping
	// PerMerchant idle connections per host. Redirects are
	// never followed, whatever the Client says: the Sender uses a copy
	// whose CheckRedirect keeps the 3xx response (a 301/302/303 would turn
	// the POST into a GET, whose 2xx would be recorded as delivered). Its
	// Transport must be nil or an *http.Transport: the copy's dials go
	// through the address guard, and never through a proxy.
	Client *http.Client
	// AllowPrivate lets webhooks go to plain http URLs and to private,
	// loopback and link-local addresses: for local development and tests
	// only. Without it every connection is checked on the address it is
	// made to, whatever the URL's name resolved to when it was stored
	// (see [netguard.Dialer]).
	AllowPrivate bool
	// Resolver resolves webhook hosts; defaults to net.DefaultResolver.
	// Tests give a name a private address with it.
	Resolver netguard.Resolver
	// SecretKey opens the merchants' sealed webhook secrets
	// (OUTFLOW_SECRET_KEY). Plaintext secrets need none; a sealed one
	// without it (or with another key) cannot be signed with: its
	// deliveries are retried until the key is fixed or MaxAttempts.
	SecretKey *secretseal.Key
	// Timeout bounds one delivery attempt, the response's body included.
	// Defaults to 10s.
	Timeout time.Duration
	// LeaseMargin is how much longer than Timeout a delivery stays leased
	// to the sender that sends it: its request is cancelled at Timeout, so
	// another sender can take the delivery only once that request ended.
	// It covers the time to settle and the clock skew between this host
	// and PostgreSQL. Defaults to 5s.
	LeaseMargin time.Duration
	// MaxAttempts is how many times a delivery is tried before it is dead.
	// Defaults to 10.
	MaxAttempts int
	// Backoff is the first retry delay; it doubles per attempt, with
	// jitter, up to BackoffMax. A Retry-After header replaces it, capped
	// by BackoffMax. Defaults to 1s and 5m.
	Backoff, BackoffMax time.Duration
	// PollInterval is how often the sender looks for due deliveries when
	// nothing wakes it (retries, and deliveries recorded by another
	// process). Defaults to 200ms.
	PollInterval time.Duration
	// Concurrency bounds the requests in flight in one Sender. Defaults
	// to 64.
	Concurrency int
	// PerMerchant bounds the requests in flight to one merchant in one
	// Sender, so a merchant that hangs holds only its own slots. Defaults
	// to 4; at most Concurrency.
	PerMerchant int
	// Wake, when set, is called by NotifyMerchant's handler after a
	// delivery it recorded has committed: set it to an in-process
	// Sender's [Sender.Wake] so the webhook leaves in milliseconds rather
	// than at the next poll. A Sender in another process finds the
	// delivery at its next poll.
	Wake func()
	// Registerer, when set, gets the Sender's metrics (see
	// [MetricWebhookAttempts] and the other Metric* names); nil: none. Two
	// Senders on one Registerer share the collectors. The Sender that
	// exports the webhook table gauges keeps one database connection open,
	// outside its pool.
	Registerer prometheus.Registerer
	// StatsInterval is how often the Sender that exports the webhook
	// table gauges refreshes them, and how often the others try to take
	// the export over. Defaults to 5s; unused without Registerer.
	StatsInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *NotifyConfig) setDefaults() {
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.LeaseMargin == 0 {
		c.LeaseMargin = 5 * time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.Backoff == 0 {
		c.Backoff = time.Second
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 5 * time.Minute
	}
	if c.PollInterval == 0 {
		c.PollInterval = 200 * time.Millisecond
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.PerMerchant == 0 {
		c.PerMerchant = min(4, c.Concurrency)
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *NotifyConfig) validate() error {
	var errs []error
	check := func(ok bool, field, want string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s", field, want))
		}
	}
	check(c.Timeout > 0, "Timeout", "must be positive")
	check(c.LeaseMargin > 0, "LeaseMargin", "must be positive")
	check(c.MaxAttempts >= 1, "MaxAttempts", "must be at least 1")
	check(c.Backoff > 0, "Backoff", "must be positive")
	check(c.BackoffMax >= c.Backoff, "BackoffMax", "must be at least Backoff")
	check(c.PollInterval > 0, "PollInterval", "must be positive")
	check(c.StatsInterval > 0, "StatsInterval", "must be positive")
	check(c.Concurrency >= 1 && c.Concurrency <= 10_000, "Concurrency", "must be between 1 and 10000")
	check(c.PerMerchant >= 1 && c.PerMerchant <= c.Concurrency, "PerMerchant", "must be between 1 and Concurrency")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("notify config: %w", err)
	}
	return nil
}

// ErrUnknownMerchant is returned by NotifyMerchant's handler for an event
// whose merchant is not in the consumer's database: the message is retried,
// then dead-lettered with that reason, rather than dropped.
var ErrUnknownMerchant = errors.New("unknown merchant")

// NotifyMerchant tells merchants about their paid and refunded payments with
// Standard Webhooks deliveries (webhook-id = the event's message id,
// webhook-timestamp, webhook-signature "v1,<base64 HMAC-SHA256 of
// id.timestamp.body>" with the merchant's secret).
//
// The handler does not call the merchant: inside the consumer's
// transaction it records one delivery per event (exactly once, keyed by the
// message id). [Sender] performs the HTTP calls afterwards, outside any
// transaction, and records every attempt. A merchant may receive a delivery
// twice (a sender dying mid-call); never two ids for one event.
//
// An event whose merchant is not in the consumer's database is an error
// ([ErrUnknownMerchant], naming the merchant): retried, then dead-lettered
// for an operator (`outflow dlq list`), never dropped. After the delivery's
// transaction committed the handler calls cfg.Wake, if set.
func NotifyMerchant(pool *pgxpool.Pool, cfg NotifyConfig) consumer.Handler {
	h := consumer.OnEach("notify-merchant", app.PaymentsTopic,
		consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev events.Event, p paymentevents.Paid) error {
			return recordDelivery(ctx, tx, ev, p.MerchantID)
		}),
		consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev events.Event, p paymentevents.Refunded) error {
			return recordDelivery(ctx, tx, ev, p.MerchantID)
		}),
	)
	h.Committed = cfg.Wake
	return h
}

// recordDelivery records, in tx, the webhook delivery of ev to merchantID,
// once per event.
func recordDelivery(ctx context.Context, tx pgx.Tx, ev events.Event, merchantID string) error {
	body, err := json.Marshal(struct {
		Type      string         `json:"type"`
		Timestamp time.Time      `json:"timestamp"`
		Data      events.Payload `json:"data"`
	}{ev.EventType, ev.OccurredAt, ev.Payload})
	if err != nil {
		return err
	}
	// One statement: whether the merchant exists, and whether this
	// event's delivery was recorded now or already (a duplicate).
	var known bool
	if err := tx.QueryRow(ctx, `
		WITH m AS (SELECT id, webhook_url FROM merchants WHERE id = $2::uuid),
		ins AS (
		    INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, traceparent)
		    SELECT $1, m.id, m.webhook_url, $3, $4, $5 FROM m
		    ON CONFLICT (message_id) DO NOTHING
		)
		SELECT EXISTS (SELECT 1 FROM m)`, ev.MessageID, merchantID, ev.EventType, body, events.Traceparent(ctx)).Scan(&known); err != nil {
		return fmt.Errorf("notify-merchant: record delivery: %w", err)
	}
	if !known {
		return fmt.Errorf("notify-merchant: merchant %s: %w", merchantID, ErrUnknownMerchant)
	}
	return nil
}

// Sign computes a Standard Webhooks signature header value; see
// [signing.Sign], which it is.
func Sign(secret, id, timestamp string, body []byte) (string, error) {
	return signing.Sign(secret, id, timestamp, body)
}
