package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/outflowtest"
)

// A handler added to a running system, whose streams no longer hold the
// first versions of older aggregates, starts from what they still hold
// when it sets Handler.BaselineBefore; a handler of the same worker that
// does not set it stays strict and holds those events as gaps.
func TestHandlerAddedLaterStartsFromItsBaseline(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx := context.Background()
	m, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
	require.NoError(t, err)
	const payments = 5
	var ids []string
	for i := range payments {
		pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: int64(100 + i), Currency: "EUR"})
		require.NoError(t, err)
		ids = append(ids, pay.ID)
	}
	// Version 1 of every payment went out and was trimmed before the new
	// handler existed: it never reaches it. (The forwarder's cursors past
	// them, as it records them: every row so far.)
	var through int64
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&through))
	require.NoError(t, outflowtest.PublishThrough(ctx, p.schema.Pool, through))
	var v1 int
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state s JOIN outbox o USING (id)
		WHERE s.published AND o.aggregate_version = 1`).Scan(&v1))
	require.Equal(t, payments, v1)
	for _, id := range ids {
		_, err = p.svc.Pay(ctx, id)
		require.NoError(t, err)
	}
	cutoff := time.Now()

	_, err = p.schema.Pool.Exec(ctx, `CREATE TABLE late_applied (message_id text NOT NULL, version bigint NOT NULL)`)
	require.NoError(t, err)
	late := consumer.Handler{Name: "late", Topic: app.PaymentsTopic, BaselineBefore: cutoff,
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO late_applied (message_id, version) VALUES ($1, $2)`, ev.MessageID, ev.AggregateVersion)
			return err
		}}
	strict, strictCounted := countingHandler(t, p)
	p.runForwarder(t, 0)
	run(t, p.worker(t, time.Second, late, strict).Run)

	outflowtest.WaitFor(t, 30*time.Second, "the late handler to apply every payment's version 2", func() bool {
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM late_applied WHERE version = 2`).Scan(&n))
		return n == payments
	})
	outflowtest.WaitFor(t, 30*time.Second, "the strict handler to hold every version 2 as a gap", func() bool {
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(ctx,
			`SELECT count(*) FROM dead_letters WHERE consumer = $1 AND status = 'held' AND aggregate_version = 2`, strict.Name).Scan(&n))
		return n == payments
	})
	require.Empty(t, strictCounted(), "the strict handler applied nothing without version 1")
	var lateTotal int
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM late_applied`).Scan(&lateTotal))
	require.Equal(t, payments, lateTotal, "each version 2 applied once, nothing else")
}
