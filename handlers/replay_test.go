package handlers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

// replayPipeline runs the reference pipeline on Redis (two partitions,
// streams of the test's own) with a counter as a third consumer, for two
// merchants, until every consumer has handled every event.
type replayPipeline struct {
	*pipeline
	m1, m2       app.CreatedMerchant
	site1, site2 *merchantSite
	want1, want2 app.CurrencyStats
	counted      func() map[string]int
	projection   []string // merchant_stats_daily, every row
	processed    map[string]int
	deliveries   int
}

func newReplayPipeline(t *testing.T) *replayPipeline {
	t.Helper()
	p := &replayPipeline{pipeline: newPipeline(t)}
	p.backend = openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: p.prefix}})
	p.m1, p.site1 = p.newMerchant(t)
	p.m2, p.site2 = p.newMerchant(t)
	counter, counted := countingHandler(t, p.pipeline)
	p.counted = counted
	p.want1 = p.drive(t, p.m1.ID, 25)
	p.want2 = p.drive(t, p.m2.ID, 15)
	p.runForwarder(t, 0)
	run(t, p.worker(t, 5*time.Second, counter).Run)
	outflowtest.WaitFor(t, 30*time.Second, "the projection to match the payments", func() bool {
		return p.stats(t, p.m1.ID) == p.want1 && p.stats(t, p.m2.ID) == p.want2
	})
	p.requireCountedOnce(t, counted)
	p.requireWebhooks(t)
	p.projection = p.readProjection(t)
	p.processed = p.readProcessed(t)
	p.deliveries = p.readDeliveries(t)
	require.Len(t, p.processed, 3, "three consumers handled events")
	return p
}

func (p *replayPipeline) readProjection(t *testing.T) []string {
	t.Helper()
	rows, err := p.schema.Pool.Query(context.Background(), `
		SELECT merchant_id, currency, day::text, paid_count, paid_amount::text, refunded_amount::text
		FROM merchant_stats_daily ORDER BY merchant_id, currency, day`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var m, c, d, amount, refunded string
		var n int64
		err := r.Scan(&m, &c, &d, &n, &amount, &refunded)
		return fmt.Sprintf("%s %s %s %d %s %s", m, c, d, n, amount, refunded), err
	})
	require.NoError(t, err)
	require.NotEmpty(t, out)
	return out
}

func (p *replayPipeline) readProcessed(t *testing.T) map[string]int {
	t.Helper()
	// Handled: each consumer's version of the row's aggregate reached it.
	return countsBy(t, p.schema.Pool, `SELECT v.consumer, count(*) FROM outbox o JOIN consumer_aggregate_versions v
		ON v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id AND v.version >= o.aggregate_version
		GROUP BY v.consumer`)
}

func (p *replayPipeline) readDeliveries(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_endpoint_deliveries`).Scan(&n))
	return n
}

// waitPublished waits until every outbox row written so far reads
// published (outbox_state): what a replay chooses. The forwarder records
// it at its lease ticks, after the broker, and the consumers, have the
// rows.
func (p *pipeline) waitPublished(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var last int64
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&last))
	outflowtest.WaitFor(t, 30*time.Second, "the forwarder to record every row published", func() bool {
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE id <= $1 AND NOT published`, last).Scan(&n))
		return n == 0
	})
}

// replayAndWait replays f to the consumer named name and waits until its
// group has read and acknowledged every replayed entry and has no open
// dead letter: from then on, whatever the replay was going to apply is
// committed. It replays once every row written before it reads published.
func (p *replayPipeline) replayAndWait(t *testing.T, name string, f replay.Filter) int64 {
	t.Helper()
	ctx := context.Background()
	p.waitPublished(t)
	stream := consumer.ReplayBrokerTopic(p.backend, name)
	before, err := p.rdb.XLen(ctx, stream).Result()
	require.NoError(t, err)
	n, err := replay.Publish(ctx, p.schema.Pool, p.backend.Broker(), name, f, replay.Options{BatchSize: 7})
	require.NoError(t, err)
	require.Positive(t, n)
	outflowtest.WaitFor(t, 30*time.Second, "the consumer to acknowledge the whole replay", func() bool {
		groups, err := p.rdb.XInfoGroups(ctx, stream).Result()
		require.NoError(t, err)
		read := false
		for _, g := range groups {
			read = read || (g.Name == name && g.EntriesRead == before+n && g.Pending == 0)
		}
		if !read {
			return false
		}
		// A message that came before its predecessor (a gap: messages
		// handled together race into their batch) was parked, and acked;
		// the consumer's retry loop applies it once the predecessor did.
		var open int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters
			WHERE consumer = $1 AND status IN ('retrying', 'held', 'dead')`, name).Scan(&open))
		return open == 0
	})
	return n
}

// A projection rebuilt as docs/replay.md says, with every consumer
// running: the consumer forgets the merchant's payments and the
// projection's rows of the merchant in one transaction, the replay applies
// their events again, and the projection is what it was. The other
// merchant's rows, the other consumers (the counter, reset too but not
// replayed to) and the webhooks do not move.
func TestRebuildProjectionByReplay(t *testing.T) {
	t.Parallel()
	p := newReplayPipeline(t)
	ctx := context.Background()

	// Step 1: the merchant's aggregates.
	rows, err := p.schema.Pool.Query(ctx, `SELECT id FROM payments WHERE merchant_id = $1`, p.m1.ID)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 25)

	// Step 2: outflow consumer reset, with the projection's SQL.
	res, err := replay.ResetConsumer(ctx, p.schema.Pool, replay.Reset{
		Consumer: "sync-analytics", AggregateType: paymentevents.AggregateType, AggregateIDs: ids,
		Also: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM merchant_stats_daily WHERE merchant_id = $1`, p.m1.ID)
			return err
		}})
	require.NoError(t, err)
	require.Equal(t, int64(25), res.Versions, "one version row per payment")
	var events int64
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregate_id = ANY($1)`, ids).Scan(&events))
	require.Zero(t, res.Processed, "no row per message to forget: the versions are the consumer's bookkeeping")
	require.Equal(t, app.CurrencyStats{Currency: "EUR"}, p.stats(t, p.m1.ID), "the merchant's projection is gone")
	// The counter forgets them too, but is not replayed to: it must not
	// apply them again, which it would if the replay reached it.
	cres, err := replay.ResetConsumer(ctx, p.schema.Pool, replay.Reset{
		Consumer: "counter", AggregateType: paymentevents.AggregateType, AggregateIDs: ids})
	require.NoError(t, err)
	require.Zero(t, cres.Processed)
	p.processed["counter"] -= int(events)

	// Step 3: outflow replay of the merchant's payments.
	n := p.replayAndWait(t, "sync-analytics", replay.Filter{Topic: app.PaymentsTopic,
		AggregateType: paymentevents.AggregateType, AggregateIDs: ids})
	require.Equal(t, events, n)

	// Step 4: verify.
	require.Equal(t, p.want1, p.stats(t, p.m1.ID))
	require.Equal(t, p.projection, p.readProjection(t), "the rebuilt projection is the original, row for row")
	require.Equal(t, p.processed, p.readProcessed(t), "sync-analytics handled its events again, the others nothing")
	require.Equal(t, p.deliveries, p.readDeliveries(t), "no webhook delivery added")
	p.requireCountedOnce(t, p.counted)
	p.requireWebhooks(t)
}

// The rebuild with the merchant's payments moving meanwhile: one pending
// payment is paid inside the reset's transaction, and the transaction goes
// on only once sync-analytics has either applied that event or is waiting
// for the reset's locks; the others are paid while the replay runs. The
// reset locks the aggregates against the consumer, so the event applies
// after the reset, once; without the lock the consumer would apply it
// before the projection's rows are deleted, and the replay, finding it
// processed, would not bring it back.
func TestRebuildWhileTheAggregatesMove(t *testing.T) {
	t.Parallel()
	p := newReplayPipeline(t)
	ctx := context.Background()
	rows, err := p.schema.Pool.Query(ctx, `SELECT id, status, amount FROM payments WHERE merchant_id = $1`, p.m1.ID)
	require.NoError(t, err)
	var ids, pending []string
	want := p.want1
	for rows.Next() {
		var id, status string
		var amount int64
		require.NoError(t, rows.Scan(&id, &status, &amount))
		ids = append(ids, id)
		if status == string(app.StatusPending) {
			pending = append(pending, id)
			want.PaidCount++
			want.PaidAmount = want.PaidAmount.Add(amount)
		}
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, len(pending), 2)

	_, err = replay.ResetConsumer(ctx, p.schema.Pool, replay.Reset{
		Consumer: "sync-analytics", AggregateType: paymentevents.AggregateType, AggregateIDs: ids,
		Also: func(ctx context.Context, tx pgx.Tx) error {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			if _, err := p.svc.Pay(ctx, pending[0]); err != nil {
				return err
			}
			outflowtest.WaitFor(t, 30*time.Second, "sync-analytics to apply the payment or wait for the reset", func() bool {
				var blocked, applied bool
				require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT
					EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))),
					EXISTS (SELECT 1 FROM outbox o JOIN consumer_aggregate_versions v ON v.consumer = 'sync-analytics'
					        AND v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id AND v.version >= o.aggregate_version
					        WHERE o.aggregate_id = $2 AND o.event_type = $3)`,
					pid, pending[0], paymentevents.PaidType).Scan(&blocked, &applied))
				return blocked || applied
			})
			_, err := tx.Exec(ctx, `DELETE FROM merchant_stats_daily WHERE merchant_id = $1`, p.m1.ID)
			return err
		}})
	require.NoError(t, err)
	paid := make(chan error, 1)
	go func() {
		for _, id := range pending[1:] {
			if _, err := p.svc.Pay(ctx, id); err != nil {
				paid <- err
				return
			}
		}
		paid <- nil
	}()
	p.replayAndWait(t, "sync-analytics", replay.Filter{Topic: app.PaymentsTopic,
		AggregateType: paymentevents.AggregateType, AggregateIDs: ids})
	require.NoError(t, <-paid)
	outflowtest.WaitFor(t, 30*time.Second, "the projection to match the payments", func() bool { return p.stats(t, p.m1.ID) == want })
	require.Equal(t, p.want2, p.stats(t, p.m2.ID))
	p.requireWebhooks(t)
}

// Rebuilding from scratch: every aggregate, the whole projection.
func TestRebuildWholeProjectionByReplay(t *testing.T) {
	t.Parallel()
	p := newReplayPipeline(t)
	ctx := context.Background()
	res, err := replay.ResetConsumer(ctx, p.schema.Pool, replay.Reset{
		Consumer: "sync-analytics", AggregateType: paymentevents.AggregateType, AllAggregates: true,
		Also: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM merchant_stats_daily`)
			return err
		}})
	require.NoError(t, err)
	require.Equal(t, int64(40), res.Versions)
	require.Zero(t, res.Processed, "no row per message to forget")
	require.Equal(t, app.CurrencyStats{Currency: "EUR"}, p.stats(t, p.m2.ID))

	p.replayAndWait(t, "sync-analytics", replay.Filter{Topic: app.PaymentsTopic})
	require.Equal(t, p.projection, p.readProjection(t), "the rebuilt projection is the original, row for row")
	require.Equal(t, p.processed, p.readProcessed(t))
	require.Equal(t, p.deliveries, p.readDeliveries(t))
}

// A replay reaches the consumer it names and no other, and without a reset
// it applies nothing twice: the consumer's idempotency skips every
// replayed event.
func TestReplayWithoutResetAppliesNothing(t *testing.T) {
	t.Parallel()
	p := newReplayPipeline(t)
	// To one consumer: the others' streams get nothing.
	p.replayAndWait(t, "sync-analytics", replay.Filter{Topic: app.PaymentsTopic})
	// The same to the counter, whose effect is a row per application.
	p.replayAndWait(t, "counter", replay.Filter{Topic: app.PaymentsTopic, EventTypes: []string{paymentevents.PaidType}})
	// And to notify-merchant, whose effect is a webhook.
	p.replayAndWait(t, "notify-merchant", replay.Filter{Topic: app.PaymentsTopic,
		AggregateType: paymentevents.AggregateType, Since: time.Now().Add(-time.Hour)})

	ctx := context.Background()
	for _, name := range []string{"sync-analytics", "notify-merchant", "counter"} {
		stream := consumer.ReplayBrokerTopic(p.backend, name)
		groups, err := p.rdb.XInfoGroups(ctx, stream).Result()
		require.NoError(t, err)
		require.Len(t, groups, 1, "only %s reads %s", name, stream)
		require.Equal(t, name, groups[0].Name)
	}
	require.Equal(t, p.projection, p.readProjection(t), "nothing applied twice")
	require.Equal(t, p.processed, p.readProcessed(t))
	require.Equal(t, p.deliveries, p.readDeliveries(t))
	p.requireCountedOnce(t, p.counted)
	p.requireWebhooks(t)
}

// requireWebhooks is merchantSite.requireWebhooks over both merchants'
// sites: one webhook per paid or refunded event, of either merchant.
func (p *replayPipeline) requireWebhooks(t *testing.T) {
	t.Helper()
	both := func() *merchantSite {
		m := &merchantSite{received: map[string][]string{}, traces: map[string]string{}}
		for _, s := range []*merchantSite{p.site1, p.site2} {
			s.mu.Lock()
			for id, types := range s.received {
				m.received[id] = append(m.received[id], types...)
			}
			m.unsigned = append(m.unsigned, s.unsigned...)
			s.mu.Unlock()
		}
		return m
	}
	want := p.messageIDs(t, paymentevents.PaidType, paymentevents.RefundedType)
	outflowtest.WaitFor(t, 30*time.Second, "a webhook for every paid or refunded event", func() bool {
		got := both().received
		for id := range want {
			if len(got[id]) == 0 {
				return false
			}
		}
		return true
	})
	both().requireWebhooks(t, p.pipeline)
}

// The reset locks the aggregates the consumer has no version of yet too:
// a payment created while its events are held back from sync-analytics
// (by a middleware of the test) is released inside the reset's
// transaction; the consumer must wait for the reset, then apply its events
// once. Without that lock it would apply them before the projection's rows
// are deleted, and the replay, finding them processed, would not bring
// them back: the merchant's projection would be short of that payment.
func TestResetLocksAggregatesTheConsumerHasNotSeen(t *testing.T) {
	t.Parallel()
	p := &replayPipeline{pipeline: newPipeline(t)}
	p.backend = openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: p.prefix}})
	ctx := context.Background()
	m, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
	require.NoError(t, err)
	want := p.drive(t, m.ID, 10)
	rows, err := p.schema.Pool.Query(ctx, `SELECT id FROM payments WHERE merchant_id = $1`, m.ID)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	known := map[string]bool{}
	for _, id := range ids {
		known[id] = true
	}

	// Events of payments created from now on wait at the gate.
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	h := handlers.SyncAnalytics()
	h.Middleware = []message.HandlerMiddleware{func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if !known[msg.Metadata.Get(events.AggregateIDKey)] {
				select {
				case arrived <- struct{}{}:
				default:
				}
				<-release
			}
			return next(msg)
		}
	}}
	reg := events.NewRegistry()
	require.NoError(t, paymentevents.Register(reg))
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: p.schema.Pool, Broker: p.backend, Registry: reg, Logger: quiet,
		ClaimIdle: 5 * time.Second})
	require.NoError(t, err)
	require.NoError(t, w.Add(h))
	p.runForwarder(t, 0)
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	run(t, w.Run)
	outflowtest.WaitFor(t, 30*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })

	x, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: 777, Currency: "EUR"})
	require.NoError(t, err)
	_, err = p.svc.Pay(ctx, x.ID)
	require.NoError(t, err)
	want.PaidCount++
	want.PaidAmount = want.PaidAmount.Add(777)
	<-arrived
	ids = append(ids, x.ID)

	_, err = replay.ResetConsumer(ctx, p.schema.Pool, replay.Reset{
		Consumer: "sync-analytics", AggregateType: paymentevents.AggregateType, AggregateIDs: ids,
		Also: func(ctx context.Context, tx pgx.Tx) error {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			released = true
			close(release)
			outflowtest.WaitFor(t, 30*time.Second, "sync-analytics to apply the payment or wait for the reset", func() bool {
				var blocked, applied bool
				require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT
					EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))),
					EXISTS (SELECT 1 FROM outbox o JOIN consumer_aggregate_versions v ON v.consumer = 'sync-analytics'
					        AND v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id AND v.version >= o.aggregate_version
					        WHERE o.aggregate_id = $2 AND o.event_type = $3)`,
					pid, x.ID, paymentevents.PaidType).Scan(&blocked, &applied))
				return blocked || applied
			})
			_, err := tx.Exec(ctx, `DELETE FROM merchant_stats_daily WHERE merchant_id = $1`, m.ID)
			return err
		}})
	require.NoError(t, err)
	p.replayAndWait(t, "sync-analytics", replay.Filter{Topic: app.PaymentsTopic,
		AggregateType: paymentevents.AggregateType, AggregateIDs: ids})
	outflowtest.WaitFor(t, 30*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
}

// The whole rebuild on every backend of the end-to-end suite: the replay
// topic is named, published and subscribed through each backend's own
// naming, so a projection rebuilt by reset and replay equals the original
// on each.
func TestRebuildOnEveryBackend(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(string(b.kind), func(t *testing.T) {
			t.Parallel()
			p := newPipeline(t)
			p.backend = b.open(t)
			ctx := context.Background()
			m, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
			require.NoError(t, err)
			want := p.drive(t, m.ID, 12)
			p.runForwarder(t, 0)
			run(t, p.worker(t, 5*time.Second).Run)
			outflowtest.WaitFor(t, 60*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
			rp := &replayPipeline{pipeline: p}
			original := rp.readProjection(t)

			_, err = replay.ResetConsumer(ctx, p.schema.Pool, replay.Reset{
				Consumer: "sync-analytics", AggregateType: paymentevents.AggregateType, AllAggregates: true,
				Also: func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `DELETE FROM merchant_stats_daily`)
					return err
				}})
			require.NoError(t, err)
			require.Equal(t, app.CurrencyStats{Currency: "EUR"}, p.stats(t, m.ID))
			p.waitPublished(t)
			n, err := replay.Publish(ctx, p.schema.Pool, p.backend.Broker(), "sync-analytics", replay.Filter{Topic: app.PaymentsTopic}, replay.Options{})
			require.NoError(t, err)
			require.EqualValues(t, p.events(t), n)
			outflowtest.WaitFor(t, 60*time.Second, "the rebuilt projection", func() bool {
				var open int
				require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters
					WHERE consumer = 'sync-analytics' AND status IN ('retrying', 'held', 'dead')`).Scan(&open))
				return open == 0 && p.stats(t, m.ID) == want
			})
			require.Equal(t, original, rp.readProjection(t), "the rebuilt projection is the original, row for row")
		})
	}
}
