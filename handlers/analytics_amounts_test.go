package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// 10,000 payments of the largest amount on one merchant, currency and day,
// all paid and refunded: 10^19, past int64, in the projection's one row.
// The projection's own statement applies each event; with bigint sums the
// 9,224th fails (a dead letter) and /stats could only wrap or fail.
func TestAnalyticsSumsManyMaxAmounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: s.Pool, Events: w})
	require.NoError(t, err)
	m, err := svc.CreateMerchant(ctx, app.NewMerchant{Name: "Big", WebhookURL: "https://big.example/h"})
	require.NoError(t, err)

	const n = 10_000
	day := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	// In transactions of 1,000 events, not one: 20,000 updates of one row in
	// a single transaction leave a chain of its versions that no one can
	// prune until it commits, and each update walks it (8 s alone, 37 s in
	// the suite, against 1.5 s). The sum crosses int64 all the same.
	const perTx = 500 // payments: two events each
	apply := func(b *pgx.Batch) {
		require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }))
	}
	b := &pgx.Batch{}
	for i := range n {
		if i > 0 && i%perTx == 0 {
			apply(b)
			b = &pgx.Batch{}
		}
		for _, p := range []events.Payload{
			paymentevents.Paid{PaymentID: "p", MerchantID: m.ID, Amount: app.MaxAmount, Currency: "EUR", PaidAt: day},
			paymentevents.Refunded{PaymentID: "p", MerchantID: m.ID, Amount: app.MaxAmount, RefundedAmount: app.MaxAmount,
				PaymentAmount: app.MaxAmount, Currency: "EUR", Status: "refunded", RefundedAt: day},
		} {
			sql, args, err := handlers.SyncAnalyticsStatement(events.Event{Payload: p})
			require.NoError(t, err)
			b.Queue(sql, args...)
		}
	}
	apply(b)

	st, err := svc.GetMerchantStats(ctx, m.ID)
	require.NoError(t, err)
	want, err := app.ParseTotal("10000000000000000000") // n × 10^15
	require.NoError(t, err)
	_, fits := want.Int64()
	require.False(t, fits, "the sum is past int64")
	require.Equal(t, app.MerchantStats{MerchantID: m.ID, PaidCount: n, PaidAmount: want, RefundedAmount: want,
		ByCurrency: []app.CurrencyStats{{Currency: "EUR", PaidCount: n, PaidAmount: want, RefundedAmount: want}}}, st)
}
