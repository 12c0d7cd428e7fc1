package app

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// EventPublisher queues the outbox write of events onto a batch sent on tx.
// *outbox.Writer is the implementation; the interface is here so benchmarks
// and tests can wrap it.
type EventPublisher interface {
	QueueTx(ctx context.Context, tx pgx.Tx, b *pgx.Batch, evs ...events.Event) error
}

// Config configures a [Service].
type Config struct {
	// Pool is the service's database. Required.
	Pool *pgxpool.Pool
	// Events publishes the service's events. Required: an *outbox.Writer.
	Events EventPublisher
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now; tests pin it.
	Now func() time.Time
	// AfterCommit, when set, is called after each of the service's own
	// transactions (InTx, every command without the Tx suffix) commits.
	// `outflow serve --roles api,forwarder` sets it to the forwarder's
	// Wake, so the events of a command reach the broker without waiting
	// for the forwarder's next poll. It must not block; nothing relies on
	// it for correctness (the forwarder polls anyway).
	AfterCommit func()
	// AllowPrivateWebhooks accepts plain http webhook URLs and URLs whose
	// host is a private, loopback or link-local address: for local
	// development and tests only (`--webhook-allow-private`).
	AllowPrivateWebhooks bool
	// SecretKey, when set, seals the webhook secrets the service stores
	// (see [secretseal]); without it they are stored in plaintext.
	SecretKey *secretseal.Key
	// WebhookSecretGrace is how long a rotated-out webhook secret stays
	// valid. Zero means DefaultWebhookSecretGrace; negative, none.
	WebhookSecretGrace time.Duration
}

// Service runs the payments commands.
type Service struct {
	pool        *pgxpool.Pool
	events      EventPublisher
	logger      *slog.Logger
	now         func() time.Time
	afterCommit func()
	urlPolicy   netguard.Policy
	secretKey   *secretseal.Key
	secretGrace time.Duration
}

func (c *Config) setDefaults() {
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	c.WebhookSecretGrace = cmp.Or(c.WebhookSecretGrace, DefaultWebhookSecretGrace)
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Pool != nil, "Pool", "is required")
	check(c.Events != nil, "Events", "is required")
	return errs.Err("app config")
}

// NewService validates cfg and returns a Service.
func NewService(cfg Config) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Service{pool: cfg.Pool, events: cfg.Events, logger: cfg.Logger, now: cfg.Now, afterCommit: cfg.AfterCommit,
		urlPolicy: netguard.Policy{AllowPrivate: cfg.AllowPrivateWebhooks}, secretKey: cfg.SecretKey,
		secretGrace: cfg.WebhookSecretGrace}, nil
}

// InTx runs fn in a transaction, committing if it returns nil, then calls
// Config.AfterCommit.
func (s *Service) InTx(ctx context.Context, fn func(pgx.Tx) error) error {
	if err := pgx.BeginFunc(ctx, s.pool, fn); err != nil {
		return err
	}
	if s.afterCommit != nil {
		s.afterCommit()
	}
	return nil
}

func (s *Service) nowUTC() time.Time {
	// Microseconds: what PostgreSQL keeps, so what we return equals what we read back.
	return s.now().UTC().Truncate(time.Microsecond)
}

// CreateMerchant creates a merchant with a fresh webhook signing secret.
func (s *Service) CreateMerchant(ctx context.Context, in NewMerchant) (CreatedMerchant, error) {
	var out CreatedMerchant
	err := s.InTx(ctx, func(tx pgx.Tx) (err error) {
		out, err = s.CreateMerchantTx(ctx, tx, in)
		return err
	})
	return out, err
}

// CreateMerchantTx is CreateMerchant in the caller's transaction.
func (s *Service) CreateMerchantTx(ctx context.Context, tx pgx.Tx, in NewMerchant) (CreatedMerchant, error) {
	if err := in.validate(s.urlPolicy); err != nil {
		return CreatedMerchant{}, err
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return CreatedMerchant{}, fmt.Errorf("generate webhook secret: %w", err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return CreatedMerchant{}, fmt.Errorf("new merchant id: %w", err)
	}
	m := CreatedMerchant{
		Merchant:      Merchant{ID: id.String(), Name: strings.TrimSpace(in.Name), WebhookURL: in.WebhookURL, CreatedAt: s.nowUTC()},
		WebhookSecret: secret,
	}
	stored, err := s.storedSecret(secret, m.ID)
	if err != nil {
		return CreatedMerchant{}, err
	}
	if err := insertMerchant(ctx, tx, m, stored); err != nil {
		return CreatedMerchant{}, err
	}
	return m, nil
}

// GetMerchant returns a merchant without its secret.
func (s *Service) GetMerchant(ctx context.Context, id string) (Merchant, error) {
	canon, ok := canonicalID(id)
	if !ok {
		return Merchant{}, &NotFoundError{Entity: "merchant", ID: id}
	}
	return getMerchant(ctx, s.pool, canon)
}

// canonicalID returns id in the lower-case, hyphenated form the database
// stores and events carry. It accepts only that 36-character form (in any
// case): uuid.Parse also takes urn:uuid: and braces, which PostgreSQL does
// not, and a consumer keying on ids must never see two spellings of one.
func canonicalID(id string) (string, bool) {
	if len(id) != 36 {
		return "", false
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// NewPayment is the input of CreatePayment.
type NewPayment struct {
	MerchantID string `json:"merchant_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

// Validate checks the input and names the first bad field.
func (p NewPayment) Validate() error {
	switch {
	case p.MerchantID == "":
		return &ValidationError{Field: "merchant_id", Message: "is required"}
	case !validID(p.MerchantID):
		return &ValidationError{Field: "merchant_id", Message: "must be a UUID such as 0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60"}
	case p.Amount <= 0:
		return &ValidationError{Field: "amount", Message: "must be a positive integer in minor units"}
	case p.Amount > MaxAmount:
		return &ValidationError{Field: "amount", Message: fmt.Sprintf("must be at most %d minor units", MaxAmount)}
	case p.Currency == "":
		return &ValidationError{Field: "currency", Message: "is required"}
	case !ValidCurrency(p.Currency):
		return &ValidationError{Field: "currency", Message: "must be an ISO 4217 code in upper case, such as EUR"}
	}
	return nil
}

// CreatePayment creates a pending payment and publishes payment.created.
func (s *Service) CreatePayment(ctx context.Context, in NewPayment) (Payment, error) {
	var out Payment
	err := s.InTx(ctx, func(tx pgx.Tx) (err error) {
		out, err = s.CreatePaymentTx(ctx, tx, in)
		return err
	})
	return out, err
}

// CreatePaymentTx is CreatePayment in the caller's transaction.
func (s *Service) CreatePaymentTx(ctx context.Context, tx pgx.Tx, in NewPayment) (Payment, error) {
	if err := in.Validate(); err != nil {
		return Payment{}, err
	}
	in.MerchantID, _ = canonicalID(in.MerchantID)
	id, err := uuid.NewV7()
	if err != nil {
		return Payment{}, fmt.Errorf("new payment id: %w", err)
	}
	now := s.nowUTC()
	p := Payment{
		ID: id.String(), MerchantID: in.MerchantID, Amount: in.Amount, Currency: in.Currency,
		Status: StatusPending, Version: 1, CreatedAt: now, UpdatedAt: now,
	}
	b := &pgx.Batch{}
	queueInsertPayment(b, p)
	err = s.queueEvent(ctx, tx, b, p, paymentevents.Created{
		PaymentID: p.ID, MerchantID: p.MerchantID, Amount: p.Amount, Currency: p.Currency,
		Status: string(p.Status), CreatedAt: p.CreatedAt,
	})
	if err != nil {
		return Payment{}, err
	}
	if err := sendBatch(ctx, tx, b); err != nil {
		return Payment{}, err
	}
	return p, nil
}

// GetPayment returns a payment.
func (s *Service) GetPayment(ctx context.Context, id string) (Payment, error) {
	canon, ok := canonicalID(id)
	if !ok {
		return Payment{}, &NotFoundError{Entity: "payment", ID: id}
	}
	return getPayment(ctx, s.pool, canon, false)
}

// Pay captures a pending payment: status paid, ledger entries, payment.paid.
func (s *Service) Pay(ctx context.Context, id string) (Payment, error) {
	return s.inTxPayment(ctx, func(tx pgx.Tx) (Payment, error) { return s.PayTx(ctx, tx, id) })
}

// PayTx is Pay in the caller's transaction.
func (s *Service) PayTx(ctx context.Context, tx pgx.Tx, id string) (Payment, error) {
	return s.change(ctx, tx, id, func(p Payment, now time.Time) (Payment, *LedgerTx, events.Payload, error) {
		p, err := p.pay(now)
		if err != nil {
			return p, nil, nil, err
		}
		lt := paymentCaptured(newID(), p)
		return p, &lt, paymentevents.Paid{
			PaymentID: p.ID, MerchantID: p.MerchantID, Amount: p.Amount, Currency: p.Currency, PaidAt: now,
		}, nil
	})
}

// Refund refunds amount, or the whole refundable rest when amount is nil.
func (s *Service) Refund(ctx context.Context, id string, amount *int64) (Payment, error) {
	return s.inTxPayment(ctx, func(tx pgx.Tx) (Payment, error) { return s.RefundTx(ctx, tx, id, amount) })
}

// RefundTx is Refund in the caller's transaction.
func (s *Service) RefundTx(ctx context.Context, tx pgx.Tx, id string, amount *int64) (Payment, error) {
	return s.change(ctx, tx, id, func(p Payment, now time.Time) (Payment, *LedgerTx, events.Payload, error) {
		p, refunded, err := p.refund(amount, now)
		if err != nil {
			return p, nil, nil, err
		}
		lt := paymentRefunded(newID(), p, refunded)
		return p, &lt, paymentevents.Refunded{
			PaymentID: p.ID, MerchantID: p.MerchantID, Amount: refunded, RefundedAmount: p.RefundedAmount,
			PaymentAmount: p.Amount, Currency: p.Currency, Status: string(p.Status), RefundedAt: now,
		}, nil
	})
}

// Cancel cancels a pending payment. No money moved, so no ledger entries.
func (s *Service) Cancel(ctx context.Context, id string) (Payment, error) {
	return s.inTxPayment(ctx, func(tx pgx.Tx) (Payment, error) { return s.CancelTx(ctx, tx, id) })
}

// CancelTx is Cancel in the caller's transaction.
func (s *Service) CancelTx(ctx context.Context, tx pgx.Tx, id string) (Payment, error) {
	return s.change(ctx, tx, id, func(p Payment, now time.Time) (Payment, *LedgerTx, events.Payload, error) {
		p, err := p.cancel(now)
		if err != nil {
			return p, nil, nil, err
		}
		return p, nil, paymentevents.Canceled{
			PaymentID: p.ID, MerchantID: p.MerchantID, Amount: p.Amount, Currency: p.Currency, CanceledAt: now,
		}, nil
	})
}

func (s *Service) inTxPayment(ctx context.Context, fn func(pgx.Tx) (Payment, error)) (Payment, error) {
	var out Payment
	err := s.InTx(ctx, func(tx pgx.Tx) (err error) {
		out, err = fn(tx)
		return err
	})
	return out, err
}

// change is the shape of every command on an existing payment: lock the
// row, apply the transition, then write the new state, its ledger entries
// and its event, all in tx.
func (s *Service) change(ctx context.Context, tx pgx.Tx, id string,
	transition func(Payment, time.Time) (Payment, *LedgerTx, events.Payload, error),
) (Payment, error) {
	canon, ok := canonicalID(id)
	if !ok {
		return Payment{}, &NotFoundError{Entity: "payment", ID: id}
	}
	cur, err := getPayment(ctx, tx, canon, true)
	if err != nil {
		return Payment{}, err
	}
	next, lt, ev, err := transition(cur, s.nowUTC())
	if err != nil {
		return Payment{}, err
	}
	// The new state, its ledger entries and its event travel in one round
	// trip; the row lock taken above already serializes them.
	b := &pgx.Batch{}
	queueUpdatePayment(b, next, cur.Version)
	if lt != nil {
		if err := lt.Validate(); err != nil {
			return Payment{}, err
		}
		queueInsertLedgerTx(b, *lt, next.UpdatedAt)
	}
	if err := s.queueEvent(ctx, tx, b, next, ev); err != nil {
		return Payment{}, err
	}
	if err := sendBatch(ctx, tx, b); err != nil {
		return Payment{}, err
	}
	return next, nil
}

func (s *Service) queueEvent(ctx context.Context, tx pgx.Tx, b *pgx.Batch, p Payment, pl events.Payload) error {
	ev, err := events.New(ctx, events.Aggregate{Type: paymentevents.AggregateType, ID: p.ID, Version: p.Version}, pl)
	if err != nil {
		return fmt.Errorf("build %s event: %w", pl.EventType(), err)
	}
	if err := s.events.QueueTx(ctx, tx, b, ev); err != nil {
		return fmt.Errorf("publish %s: %w", pl.EventType(), err)
	}
	return nil
}

func validID(id string) bool {
	_, ok := canonicalID(id)
	return ok
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }
