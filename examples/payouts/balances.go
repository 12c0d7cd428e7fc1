package payouts

import (
	"context"
	"fmt"

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
	return consumer.Handler{
		Name:       BalancesName,
		Topic:      AggregateType,
		EventTypes: []string{RequestedType, SentType, FailedType},
		Func:       applyBalance,
	}
}

func applyBalance(ctx context.Context, tx pgx.Tx, ev events.Event) error {
	var merchant, currency string
	var inFlight, paidOut int64
	switch p := ev.Payload.(type) {
	case Requested:
		merchant, currency, inFlight = p.MerchantID, p.Currency, p.AmountMinor
	case Sent:
		merchant, currency, inFlight, paidOut = p.MerchantID, p.Currency, -p.AmountMinor, p.AmountMinor
	case Failed:
		merchant, currency, inFlight = p.MerchantID, p.Currency, -p.AmountMinor
	default:
		return fmt.Errorf("payout balances: unexpected %T", ev.Payload)
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO payout_balances (merchant_id, currency, in_flight_minor, paid_out_minor)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (merchant_id, currency) DO UPDATE
		SET in_flight_minor = payout_balances.in_flight_minor + EXCLUDED.in_flight_minor,
		    paid_out_minor = payout_balances.paid_out_minor + EXCLUDED.paid_out_minor`,
		merchant, currency, inFlight, paidOut)
	return err
}
