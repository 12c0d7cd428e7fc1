package handlers

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// A sender whose lease lapsed settles late, after another sender delivered
// the delivery and retention purged it (an old delivery that stayed
// pending through an outage): the late attempt has no delivery to attach
// to, and the other results of the same statement must still be recorded,
// not fail with it (their deliveries would go out again, duplicates).
func TestSettleOutlivesAPurgedDelivery(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	ctx := context.Background()
	rows, err := s.Pool.Query(ctx, `
		INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, lease_token, created_at)
		SELECT gen_random_uuid(), gen_random_uuid(), 'https://shop.example/hook', 'payment.paid', '{}', gen_random_uuid(),
		       now() - interval '20 days'
		FROM generate_series(1, 2)
		RETURNING id, lease_token::text`)
	require.NoError(t, err)
	var batch []settled
	for rows.Next() {
		var d delivery
		require.NoError(t, rows.Scan(&d.ID, &d.LeaseToken))
		batch = append(batch, settled{d: d, a: result{code: 200, retryAfter: -1}, status: "delivered", attempts: 1})
	}
	require.NoError(t, rows.Err())
	require.Len(t, batch, 2)
	gone, kept := batch[0].d.ID, batch[1].d.ID

	// Another sender delivered the first one; retention purged it.
	_, err = s.Pool.Exec(ctx, `UPDATE webhook_deliveries SET status = 'delivered', lease_token = NULL, attempts = 1 WHERE id = $1`, gone)
	require.NoError(t, err)
	purged, _, err := PurgeWebhooks(ctx, s.Pool, time.Now().Add(-time.Hour), 10)
	require.NoError(t, err)
	require.Equal(t, 1, purged)

	snd := NewSender(s.Pool, NotifyConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, snd.settle(ctx, batch))
	var status string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT status FROM webhook_deliveries WHERE id = $1`, kept).Scan(&status))
	require.Equal(t, "delivered", status, "the other result of the statement is recorded")
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_attempts WHERE delivery_id = $1 AND NOT lease_lost`, kept).Scan(&n))
	require.Equal(t, 1, n)
}

// A sender's lease lapsed mid-request (a slow merchant, a loaded machine)
// and the same sender leased the delivery again: both results can reach
// one settle statement. Only the one under the current lease is the
// holder's; the other is recorded lease_lost, so the delivery has one
// successful attempt by a lease holder and a count that matches (two such
// attempts were recorded, TestTwoSendersAtOnce under load).
func TestSettleTellsALapsedLeaseFromTheNextInOneBatch(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	ctx := context.Background()
	var d delivery
	require.NoError(t, s.Pool.QueryRow(ctx, `
		INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, lease_token)
		VALUES (gen_random_uuid(), gen_random_uuid(), 'https://shop.example/hook', 'payment.paid', '{}', gen_random_uuid())
		RETURNING id, lease_token::text`).Scan(&d.ID, &d.LeaseToken))
	lapsed := d
	lapsed.LeaseToken = "0190c0de-0000-7000-8000-0000000000aa" // the first lease's, since replaced
	ok := result{code: 200, retryAfter: -1}
	snd := NewSender(s.Pool, NotifyConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, snd.settle(ctx, []settled{
		{d: lapsed, a: ok, status: "delivered", attempts: 1},
		{d: d, a: ok, status: "delivered", attempts: 1},
	}))
	var holders, lost, attempts int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT lease_lost), count(*) FILTER (WHERE lease_lost),
		(SELECT attempts FROM webhook_deliveries WHERE id = $1) FROM webhook_attempts WHERE delivery_id = $1`, d.ID).Scan(&holders, &lost, &attempts))
	require.Equal(t, [3]int{1, 1, 1}, [3]int{holders, lost, attempts}, "one attempt by the holder, one lease_lost, one counted")
}
