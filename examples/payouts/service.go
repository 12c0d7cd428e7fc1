package payouts

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
)

// ErrNotFound is returned for a payout id that does not exist.
var ErrNotFound = errors.New("payout not found")

// ErrConflict is returned for a change the payout's status does not allow
// (sending a payout that failed, say).
var ErrConflict = errors.New("payout status does not allow this change")

// InvalidError names the input field a request got wrong.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

// Payout is one payout as stored.
type Payout struct {
	ID          string `json:"id"`
	MerchantID  string `json:"merchant_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
	Version     int64  `json:"version"`
}

// Service runs the payout commands. Each command changes the payout and
// writes its event in one transaction: both commit or neither does.
type Service struct {
	pool   *pgxpool.Pool
	writer *outbox.Writer
	// afterCommit wakes an in-process forwarder; nil when the forwarder
	// runs elsewhere (it polls anyway).
	afterCommit func()
}

// NewService returns a Service writing to pool. afterCommit may be nil.
func NewService(pool *pgxpool.Pool, writer *outbox.Writer, afterCommit func()) *Service {
	return &Service{pool: pool, writer: writer, afterCommit: afterCommit}
}

// Request records a payout of amountMinor (in the currency's minor units)
// to merchantID and writes a [Requested] event.
func (s *Service) Request(ctx context.Context, merchantID string, amountMinor int64, currency string) (Payout, error) {
	currency = strings.ToUpper(strings.TrimSpace(currency))
	switch {
	case strings.TrimSpace(merchantID) == "":
		return Payout{}, &InvalidError{Field: "merchant_id", Reason: "is required"}
	case amountMinor <= 0:
		return Payout{}, &InvalidError{Field: "amount_minor", Reason: "must be a positive number of minor units"}
	case len(currency) != 3 || strings.Trim(currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "":
		return Payout{}, &InvalidError{Field: "currency", Reason: "must be an ISO 4217 code such as EUR"}
	}
	p := Payout{ID: uuid.NewString(), MerchantID: merchantID, AmountMinor: amountMinor,
		Currency: currency, Status: "requested", Version: 1}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			INSERT INTO payouts (id, merchant_id, amount_minor, currency, status, version)
			VALUES ($1, $2, $3, $4, $5, $6)`,
			p.ID, p.MerchantID, p.AmountMinor, p.Currency, p.Status, p.Version); err != nil {
			return fmt.Errorf("insert payout: %w", err)
		}
		return s.writer.WriteTx(ctx, tx, p.Aggregate(), Requested{PayoutID: p.ID, MerchantID: p.MerchantID,
			AmountMinor: p.AmountMinor, Currency: p.Currency})
	})
	return p, err
}

// MarkSent records that the bank accepted payout id and writes a [Sent]
// event. Only a requested payout can be sent.
func (s *Service) MarkSent(ctx context.Context, id string) (Payout, error) {
	return s.settle(ctx, id, "sent", "", func(p Payout) events.Payload {
		return Sent{PayoutID: p.ID, MerchantID: p.MerchantID, Amount: Money{Minor: p.AmountMinor, Currency: p.Currency}}
	})
}

// MarkFailed records that the bank refused payout id and writes a [Failed]
// event. Only a requested payout can fail.
func (s *Service) MarkFailed(ctx context.Context, id, reason string) (Payout, error) {
	if strings.TrimSpace(reason) == "" {
		return Payout{}, &InvalidError{Field: "reason", Reason: "is required"}
	}
	return s.settle(ctx, id, "failed", reason, func(p Payout) events.Payload {
		return Failed{PayoutID: p.ID, MerchantID: p.MerchantID, AmountMinor: p.AmountMinor,
			Currency: p.Currency, Reason: reason}
	})
}

func (s *Service) settle(ctx context.Context, id, status, failure string, event func(Payout) events.Payload) (Payout, error) {
	if uuid.Validate(id) != nil {
		return Payout{}, &InvalidError{Field: "id", Reason: "must be a UUID"}
	}
	var p Payout
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		// The row lock taken by the UPDATE orders concurrent changes of
		// one payout, so versions never repeat.
		err := tx.QueryRow(ctx, `
			UPDATE payouts SET status = $2, failure = NULLIF($3, ''), version = version + 1, updated_at = now()
			WHERE id = $1 AND status = 'requested'
			RETURNING id, merchant_id, amount_minor, currency, status, version`, id, status, failure).
			Scan(&p.ID, &p.MerchantID, &p.AmountMinor, &p.Currency, &p.Status, &p.Version)
		if errors.Is(err, pgx.ErrNoRows) {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM payouts WHERE id = $1)`, id).Scan(&exists); err != nil {
				return err
			}
			if exists {
				return ErrConflict
			}
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("update payout: %w", err)
		}
		return s.writer.WriteTx(ctx, tx, p.Aggregate(), event(p))
	})
	return p, err
}

// Aggregate is the payout as its events name it, at its current version:
// the version its latest change's event carries.
func (p Payout) Aggregate() events.Aggregate {
	return events.Aggregate{Type: AggregateType, ID: p.ID, Version: p.Version}
}

func (s *Service) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	if err := pgx.BeginFunc(ctx, s.pool, fn); err != nil {
		return err
	}
	if s.afterCommit != nil {
		s.afterCommit()
	}
	return nil
}

// Balance is a merchant's payout balance in one currency, as the
// [Balances] consumer keeps it.
type Balance struct {
	MerchantID    string `json:"merchant_id"`
	Currency      string `json:"currency"`
	InFlightMinor int64  `json:"in_flight_minor"`
	PaidOutMinor  int64  `json:"paid_out_minor"`
}

// Balances returns merchantID's balances, one per currency.
func (s *Service) Balances(ctx context.Context, merchantID string) ([]Balance, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT merchant_id, currency, in_flight_minor, paid_out_minor
		FROM payout_balances WHERE merchant_id = $1 ORDER BY currency`, merchantID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Balance])
}
