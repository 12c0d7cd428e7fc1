package payouts

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/google/uuid"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
)

// RequestStd is [Service.Request] for a service on database/sql (any
// driver that speaks to PostgreSQL: pgx's stdlib, lib/pq): the same two
// writes in one *sql.Tx, so both commit or neither does.
func RequestStd(ctx context.Context, db *sql.DB, w *outbox.Writer, merchantID string, amountMinor int64, currency string) (string, error) {
	id := uuid.NewString()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback() // a no-op once committed

	if _, err := tx.ExecContext(ctx, `
		INSERT INTO payouts (id, merchant_id, amount_minor, currency, status, version)
		VALUES ($1, $2, $3, $4, 'requested', 1)`, id, merchantID, amountMinor, currency); err != nil {
		return "", fmt.Errorf("insert payout: %w", err)
	}
	if err := w.WriteStdTx(ctx, tx, events.Aggregate{Type: AggregateType, ID: id, Version: 1},
		Requested{PayoutID: id, MerchantID: merchantID, AmountMinor: amountMinor, Currency: currency}); err != nil {
		return "", err
	}
	return id, tx.Commit()
}
