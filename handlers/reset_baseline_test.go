package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

// Issue 22, item 4: a handler with BaselineBefore, reset for every
// aggregate, then a live event (each payment's refund, version 3) that
// arrives before the replay of versions 1 and 2 and waits past GapTimeout.
// A reset aggregate's history starts again at version 1: the refund must
// dead-letter (loud) rather than become the baseline, and the replay that
// comes after must apply versions 1 and 2 and heal it. Before the fix the
// refunds became the baselines and the replay's events were skipped as
// stale: 20 events applied before the reset, 10 after it and the replay.
func TestResetWithBaselineKeepsHistory(t *testing.T) {
	t.Parallel()
	p := &replayPipeline{pipeline: newPipeline(t)}
	p.backend = openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: p.prefix}})
	ctx := context.Background()
	m, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
	require.NoError(t, err)
	const payments = 10
	var ids []string
	for i := range payments {
		pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: int64(100 + i), Currency: "EUR"})
		require.NoError(t, err)
		_, err = p.svc.Pay(ctx, pay.ID)
		require.NoError(t, err)
		ids = append(ids, pay.ID)
	}
	// The handler was deployed after these events: they may be baselines.
	cutoff := time.Now()

	_, err = p.schema.Pool.Exec(ctx, `CREATE TABLE history (aggregate_id text NOT NULL, version bigint NOT NULL)`)
	require.NoError(t, err)
	const name = "history"
	h := consumer.Handler{Name: name, Topic: app.PaymentsTopic, BaselineBefore: cutoff,
		Idempotency: idempotency.Config{GapTimeout: time.Second, GapRetryDelay: 50 * time.Millisecond,
			RetryPollInterval: 20 * time.Millisecond},
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO history (aggregate_id, version) VALUES ($1, $2)`, ev.AggregateID, ev.AggregateVersion)
			return err
		}}
	p.runForwarder(t, 0)
	run(t, p.worker(t, 5*time.Second, h).Run)
	count := func(q string, args ...any) (n int) {
		require.NoError(t, p.schema.Pool.QueryRow(ctx, q, args...).Scan(&n))
		return n
	}
	// Under a loaded suite this wait once ran out (36 s): say what the
	// consumer's bookkeeping held then.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, err := p.schema.Pool.Query(context.Background(), `SELECT aggregate_id, aggregate_version, status, reason, left(coalesce(error, ''), 200)
			FROM dead_letters WHERE consumer = $1 ORDER BY id`, name)
		if err != nil {
			t.Logf("dead letters: %v", err)
			return
		}
		for rows.Next() {
			var agg, status, reason, msg string
			var v int64
			if rows.Scan(&agg, &v, &status, &reason, &msg) == nil {
				t.Logf("dead letter: %s v%d %s %s: %s", agg, v, status, reason, msg)
			}
		}
		rows.Close()
		t.Logf("history rows: %d", count(`SELECT count(*) FROM history`))
	})
	outflowtest.WaitFor(t, 30*time.Second, "the handler to apply the 20 events", func() bool {
		return count(`SELECT count(*) FROM history`) == 2*payments
	})

	_, err = replay.ResetConsumer(ctx, p.schema.Pool, replay.Reset{
		Consumer: name, AggregateType: paymentevents.AggregateType, AllAggregates: true,
		Also: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM history`)
			return err
		}})
	require.NoError(t, err)

	// Live events after the reset, before the replay: each payment's v3.
	for _, id := range ids {
		_, err := p.svc.Refund(ctx, id, nil)
		require.NoError(t, err)
	}
	outflowtest.WaitFor(t, 30*time.Second, "every refund to wait out GapTimeout", func() bool {
		return count(`SELECT count(*) FROM dead_letters WHERE consumer = $1 AND aggregate_version = 3 AND status IN ('dead', 'resolved')`,
			name) == payments
	})
	deadGaps := count(`SELECT count(*) FROM dead_letters
		WHERE consumer = $1 AND aggregate_version = 3 AND status = 'dead' AND reason = 'gap' AND error LIKE '%reset%'`, name)
	appliedEarly := count(`SELECT count(*) FROM history`)

	p.replayAndWait(t, name, replay.Filter{Topic: app.PaymentsTopic})
	require.Equal(t, 3*payments, count(`SELECT count(*) FROM history`), "versions 1 and 2 replayed, then each refund healed")
	require.Equal(t, payments, deadGaps, "each refund was a dead gap that names the reset, not a baseline")
	require.Zero(t, appliedEarly, "nothing applied before the replay")
	require.Equal(t, payments, count(`SELECT count(*) FROM (
		SELECT aggregate_id FROM history GROUP BY aggregate_id HAVING array_agg(version ORDER BY version) = '{1,2,3}') x`),
		"each payment's three versions, once each")
	require.Zero(t, count(`SELECT count(*) FROM dead_letters WHERE consumer = $1 AND status IN ('retrying', 'held', 'dead')`, name))
}
