package handlers

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/payment"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/poll"
)

// NotifyConfig configures the merchant webhook sender.
type NotifyConfig struct {
	// Client sends the webhooks. Defaults to an http.Client with Timeout.
	Client *http.Client
	// Timeout bounds one delivery attempt. Defaults to 10s.
	Timeout time.Duration
	// MaxAttempts is how many times a delivery is tried before it is dead.
	// Defaults to 10.
	MaxAttempts int
	// Backoff is the first retry delay; it doubles per attempt, with
	// jitter, up to BackoffMax. Defaults to 1s and 5m.
	Backoff, BackoffMax time.Duration
	// PollInterval is how often the sender looks for due deliveries.
	// Defaults to 200ms.
	PollInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *NotifyConfig) setDefaults() {
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Client == nil {
		c.Client = &http.Client{Timeout: c.Timeout}
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
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

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
func NotifyMerchant(pool *pgxpool.Pool, cfg NotifyConfig) Handler {
	return Handler{
		Name:       "notify-merchant",
		Topic:      app.PaymentsTopic,
		EventTypes: []string{payment.PaidType, payment.RefundedType},
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			var merchantID string
			switch p := ev.Payload.(type) {
			case payment.Paid:
				merchantID = p.MerchantID
			case payment.Refunded:
				merchantID = p.MerchantID
			default:
				return errors.New("notify-merchant: unexpected payload")
			}
			body, err := json.Marshal(struct {
				Type      string         `json:"type"`
				Timestamp time.Time      `json:"timestamp"`
				Data      events.Payload `json:"data"`
			}{ev.EventType, ev.OccurredAt, ev.Payload})
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `
				INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body)
				SELECT $1, m.id, m.webhook_url, $3, $4 FROM merchants m WHERE m.id = $2
				ON CONFLICT (message_id) DO NOTHING`, ev.MessageID, merchantID, ev.EventType, body)
			return err
		},
	}
}

// Sender delivers recorded webhooks.
type Sender struct {
	pool *pgxpool.Pool
	cfg  NotifyConfig
}

// NewSender returns a Sender.
func NewSender(pool *pgxpool.Pool, cfg NotifyConfig) *Sender {
	cfg.setDefaults()
	return &Sender{pool: pool, cfg: cfg}
}

// Run delivers due webhooks until ctx is done.
func (s *Sender) Run(ctx context.Context) error {
	poll.Drain(ctx, s.cfg.PollInterval, func(ctx context.Context) (int, error) { return s.SendDue(ctx, 20) },
		func(err error) { s.cfg.Logger.Warn("send webhooks", "error", err.Error()) })
	return nil
}

type delivery struct {
	ID         int64
	MessageID  string
	URL        string
	Body       []byte
	Attempts   int
	MerchantID string
	Secret     string
}

// SendDue sends up to limit due deliveries and returns how many it tried.
// Each is leased for the attempt's timeout in a short transaction, sent with
// no transaction open, then settled in another short transaction.
func (s *Sender) SendDue(ctx context.Context, limit int) (int, error) {
	lease := s.cfg.Timeout + 5*time.Second
	rows, err := s.pool.Query(ctx, `
		UPDATE webhook_deliveries d SET next_attempt_at = now() + make_interval(secs => $2)
		FROM merchants m
		WHERE d.id IN (SELECT id FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= now()
		               ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		  AND m.id = d.merchant_id
		RETURNING d.id, d.message_id::text, d.url, d.body, d.attempts, m.id::text, m.webhook_secret`, limit, lease.Seconds())
	if err != nil {
		return 0, fmt.Errorf("lease webhook deliveries: %w", err)
	}
	due, err := pgx.CollectRows(rows, pgx.RowToStructByPos[delivery])
	if err != nil {
		return 0, fmt.Errorf("lease webhook deliveries: %w", err)
	}
	for _, d := range due {
		code, latency, sendErr := s.send(ctx, d)
		if err := s.settle(ctx, d, code, latency, sendErr); err != nil {
			return len(due), err
		}
	}
	return len(due), nil
}

func (s *Sender) send(ctx context.Context, d delivery) (int, time.Duration, error) {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sig, err := Sign(d.Secret, d.MessageID, ts, d.Body)
	if err != nil {
		return 0, 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", d.MessageID)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", sig)
	start := time.Now()
	resp, err := s.cfg.Client.Do(req)
	latency := time.Since(start)
	if err != nil {
		return 0, latency, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode, latency, nil
}

// Retryable reports whether a delivery that got status (0: no response)
// is worth trying again: network errors and timeouts, 429 and 5xx are;
// other 4xx mean the merchant refuses it.
func Retryable(status int) bool {
	return status == 0 || status == http.StatusTooManyRequests || status >= 500
}

func (s *Sender) settle(ctx context.Context, d delivery, code int, latency time.Duration, sendErr error) error {
	ctx = context.WithoutCancel(ctx)
	var errText *string
	if sendErr != nil {
		e := sendErr.Error()
		errText = &e
	}
	var codePtr *int
	if code != 0 {
		codePtr = &code
	}
	attempts := d.Attempts + 1
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, status_code, latency_ms, error) VALUES ($1, $2, $3, $4)`,
			d.ID, codePtr, float64(latency.Microseconds())/1000, errText); err != nil {
			return err
		}
		var err error
		switch {
		case sendErr == nil && code/100 == 2:
			_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET status = 'delivered', attempts = $2, delivered_at = now(), last_error = NULL WHERE id = $1`, d.ID, attempts)
		case Retryable(code) && attempts < s.cfg.MaxAttempts:
			_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET attempts = $2, next_attempt_at = $3, last_error = $4 WHERE id = $1`,
				d.ID, attempts, time.Now().Add(s.backoff(attempts)), outcome(code, sendErr))
		default:
			_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET status = 'dead', attempts = $2, last_error = $3 WHERE id = $1`,
				d.ID, attempts, outcome(code, sendErr))
			s.cfg.Logger.Warn("webhook delivery dead", "message_id", d.MessageID, "merchant_id", d.MerchantID,
				"attempts", attempts, "last", outcome(code, sendErr))
		}
		return err
	})
}

func outcome(code int, err error) string {
	if err != nil {
		return err.Error()
	}
	return "HTTP " + strconv.Itoa(code)
}

func (s *Sender) backoff(attempt int) time.Duration {
	return backoff.Delay(s.cfg.Backoff, s.cfg.BackoffMax, attempt)
}

// Sign computes a Standard Webhooks signature header value:
// "v1," + base64(HMAC-SHA256(key, id + "." + timestamp + "." + body)), where
// the key is the base64 part of a "whsec_" secret.
func Sign(secret, id, timestamp string, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return "", fmt.Errorf("webhook secret is not base64: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}
