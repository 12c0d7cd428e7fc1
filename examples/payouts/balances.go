package payouts

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
)

// BalancesName is the [Balances] consumer's name: its consumer group and
// its deduplication key.
const BalancesName = "payout-balances"

// Balances is the consumer that keeps payout_balances. Its writes happen in
// the transaction the idempotency middleware opens for the message, which
// also records the message as processed: a redelivered event changes
// nothing, and a payout's Sent is never applied before its Requested.
func Balances() consumer.Handler {
	return consumer.OnEach(BalancesName, AggregateType,
		consumer.Typed(func(ctx context.Context, tx pgx.Tx, _ events.Event, p Requested) error {
			return addBalance(ctx, tx, p.MerchantID, p.Currency, p.AmountMinor, 0)
		}),
		consumer.Typed(func(ctx context.Context, tx pgx.Tx, _ events.Event, p Sent) error {
			return addBalance(ctx, tx, p.MerchantID, p.Amount.Currency, -p.Amount.Minor, p.Amount.Minor)
		}),
		consumer.Typed(func(ctx context.Context, tx pgx.Tx, _ events.Event, p Failed) error {
			return addBalance(ctx, tx, p.MerchantID, p.Currency, -p.AmountMinor, 0)
		}),
	)
}

// addBalance adds inFlight and paidOut (minor units, either may be
// negative) to merchant's balance in currency, in tx.
func addBalance(ctx context.Context, tx pgx.Tx, merchant, currency string, inFlight, paidOut int64) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO payout_balances (merchant_id, currency, in_flight_minor, paid_out_minor)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (merchant_id, currency) DO UPDATE
		SET in_flight_minor = payout_balances.in_flight_minor + EXCLUDED.in_flight_minor,
		    paid_out_minor = payout_balances.paid_out_minor + EXCLUDED.paid_out_minor`,
		merchant, currency, inFlight, paidOut)
	return err
}
