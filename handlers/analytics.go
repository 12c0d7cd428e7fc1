package handlers

import (
	"context"
	"errors"
	"time"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
)

// SyncAnalytics keeps the per-merchant projection merchant_stats_daily:
// paid_count and paid_amount over every payment.paid, refunded_amount over
// every payment.refunded (a refund does not un-count the payment), per
// currency and day. Its writes commit with the message's processed row, so
// each event counts exactly once.
func SyncAnalytics() consumer.Handler {
	return consumer.Handler{
		Name:       "sync-analytics",
		Topic:      app.PaymentsTopic,
		EventTypes: []string{paymentevents.PaidType, paymentevents.RefundedType},
		Func: func(ctx context.Context, _ pgx.Tx, ev events.Event) error {
			sql, args, err := SyncAnalyticsStatement(ev)
			if err != nil {
				return err
			}
			// A blind, commutative upsert: queued, it travels with the
			// batch's other queued statements in one round trip.
			return idempotency.QueueExec(ctx, sql, args...)
		},
	}
}

// SyncAnalyticsStatement is the upsert SyncAnalytics applies for a paid or
// refunded event, for code that sends it itself (the benchmark's plain
// baseline).
func SyncAnalyticsStatement(ev events.Event) (sql string, args []any, err error) {
	var (
		merchant, currency  string
		day                 time.Time
		paidN, paid, refund int64
	)
	switch p := ev.Payload.(type) {
	case paymentevents.Paid:
		merchant, currency, day, paidN, paid = p.MerchantID, p.Currency, p.PaidAt, 1, p.Amount
	case paymentevents.Refunded:
		merchant, currency, day, refund = p.MerchantID, p.Currency, p.RefundedAt, p.Amount
	default:
		return "", nil, errors.New("sync-analytics: unexpected payload")
	}
	return `
		INSERT INTO merchant_stats_daily (merchant_id, currency, day, paid_count, paid_amount, refunded_amount)
		VALUES ($1, $2, $3::date, $4, $5, $6)
		ON CONFLICT (merchant_id, currency, day) DO UPDATE SET
			paid_count = merchant_stats_daily.paid_count + excluded.paid_count,
			paid_amount = merchant_stats_daily.paid_amount + excluded.paid_amount,
			refunded_amount = merchant_stats_daily.refunded_amount + excluded.refunded_amount`,
		[]any{merchant, currency, day.UTC(), paidN, paid, refund}, nil
}
