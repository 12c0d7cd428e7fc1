package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const paymentColumns = `id::text, merchant_id::text, amount, refunded_amount, currency, status, version, created_at, updated_at`

func scanPayment(row pgx.Row) (Payment, error) {
	var p Payment
	err := row.Scan(&p.ID, &p.MerchantID, &p.Amount, &p.RefundedAmount, &p.Currency, &p.Status, &p.Version, &p.CreatedAt, &p.UpdatedAt)
	p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	return p, err
}

func getPayment(ctx context.Context, q querier, id string, forUpdate bool) (Payment, error) {
	sql := `SELECT ` + paymentColumns + ` FROM payments WHERE id = $1`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	p, err := scanPayment(q.QueryRow(ctx, sql, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, &NotFoundError{Entity: "payment", ID: id}
	}
	if err != nil {
		return Payment{}, fmt.Errorf("read payment: %w", err)
	}
	return p, nil
}

func queueInsertPayment(b *pgx.Batch, p Payment) {
	b.Queue(`
		INSERT INTO payments (id, merchant_id, amount, refunded_amount, currency, status, version, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		p.ID, p.MerchantID, p.Amount, p.RefundedAmount, p.Currency, p.Status, p.Version, p.CreatedAt, p.UpdatedAt)
}

// queueUpdatePayment writes p if the row is still at prevVersion. The row is
// locked by the caller, so a mismatch means a bug, not a race.
func queueUpdatePayment(b *pgx.Batch, p Payment, prevVersion int64) {
	b.Queue(`
		UPDATE payments SET refunded_amount = $2, status = $3, version = $4, updated_at = $5
		WHERE id = $1 AND version = $6`,
		p.ID, p.RefundedAmount, p.Status, p.Version, p.UpdatedAt, prevVersion,
	).Exec(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("update payment %s: version %d changed under a row lock", p.ID, prevVersion)
		}
		return nil
	})
}

// queueInsertLedgerTx writes the transaction and its entries in one statement.
func queueInsertLedgerTx(b *pgx.Batch, t LedgerTx, at time.Time) {
	accounts := make([]string, len(t.Entries))
	amounts := make([]int64, len(t.Entries))
	currencies := make([]string, len(t.Entries))
	for i, e := range t.Entries {
		accounts[i], amounts[i], currencies[i] = e.Account, e.Amount, e.Currency
	}
	b.Queue(`
		WITH t AS (
			INSERT INTO ledger_transactions (id, payment_id, kind, created_at) VALUES ($1, $2, $3, $4)
		)
		INSERT INTO ledger_entries (transaction_id, account, amount, currency)
		SELECT $1, e.account, e.amount, e.currency
		FROM unnest($5::text[], $6::bigint[], $7::text[]) AS e(account, amount, currency)`,
		t.ID, t.PaymentID, t.Kind, at, accounts, amounts, currencies)
}

// sendBatch sends b on tx and reads every result. A payment that names no
// merchant is the caller's mistake, reported on the field.
func sendBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	err := tx.SendBatch(ctx, b).Close()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" && pgErr.ConstraintName == "payments_merchant_id_fkey" {
		return &ValidationError{Field: "merchant_id", Message: "no such merchant"}
	}
	if err != nil {
		return fmt.Errorf("write command: %w", err)
	}
	return nil
}

// insertMerchant writes m with its secret as stored (sealed or plaintext).
func insertMerchant(ctx context.Context, q querier, m CreatedMerchant, storedSecret string) error {
	_, err := q.Exec(ctx, `
		INSERT INTO merchants (id, name, webhook_url, webhook_secret, created_at) VALUES ($1, $2, $3, $4, $5)`,
		m.ID, m.Name, m.WebhookURL, storedSecret, m.CreatedAt)
	if err != nil {
		return fmt.Errorf("insert merchant: %w", err)
	}
	return nil
}

func getMerchant(ctx context.Context, q querier, id string) (Merchant, error) {
	var m Merchant
	err := q.QueryRow(ctx, `SELECT id::text, name, webhook_url, created_at FROM merchants WHERE id = $1`, id).
		Scan(&m.ID, &m.Name, &m.WebhookURL, &m.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Merchant{}, &NotFoundError{Entity: "merchant", ID: id}
	}
	if err != nil {
		return Merchant{}, fmt.Errorf("read merchant: %w", err)
	}
	m.CreatedAt = m.CreatedAt.UTC()
	return m, nil
}
