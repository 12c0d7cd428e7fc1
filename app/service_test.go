package app_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
)

type bundle struct {
	schema *outflowtest.Schema
	svc    *app.Service
}

func setup(t *testing.T, pub app.EventPublisher) *bundle {
	t.Helper()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	if pub == nil {
		w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
		require.NoError(t, err)
		pub = w
	}
	svc, err := app.NewService(app.Config{Pool: s.Pool, Events: pub})
	require.NoError(t, err)
	return &bundle{schema: s, svc: svc}
}

func (b *bundle) paidPayment(t *testing.T, amount int64) app.Payment {
	t.Helper()
	ctx := context.Background()
	m, err := b.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/hooks"})
	require.NoError(t, err)
	p, err := b.svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: amount, Currency: "EUR"})
	require.NoError(t, err)
	p, err = b.svc.Pay(ctx, p.ID)
	require.NoError(t, err)
	return p
}

func (b *bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// Concurrent commands on one payment serialize on its row lock, so its
// events carry versions 1..N in commit order, with no gap and no repeat.
func TestConcurrentCommandsGiveGaplessVersions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	p := b.paidPayment(t, 1_000_000) // versions 1 (created) and 2 (paid)

	const refunds = 50
	var wg sync.WaitGroup
	errs := make(chan error, refunds)
	one := int64(1)
	for range refunds {
		wg.Go(func() {
			_, err := b.svc.Refund(ctx, p.ID, &one)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	rows, err := b.schema.Pool.Query(ctx, `
		SELECT aggregate_version FROM outbox WHERE aggregate_id = $1 ORDER BY id`, p.ID)
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, versions, refunds+2)
	for i, v := range versions {
		require.Equal(t, int64(i+1), v, "outbox id order must equal version order")
	}

	got, err := b.svc.GetPayment(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, int64(refunds+2), got.Version)
	require.Equal(t, int64(refunds), got.RefundedAmount)
	require.Equal(t, app.StatusPartiallyRefunded, got.Status)
}

// failingPublisher wraps the real writer and fails after it queued the
// write, so the command's transaction must roll back the state change with
// the event.
type failingPublisher struct {
	app.EventPublisher
}

var errPublish = errors.New("injected publish failure")

func (f failingPublisher) QueueTx(ctx context.Context, tx pgx.Tx, b *pgx.Batch, evs ...events.Event) error {
	if err := f.EventPublisher.QueueTx(ctx, tx, b, evs...); err != nil {
		return err
	}
	return errPublish
}

func TestFailedPublishRollsBackStateChange(t *testing.T) {
	t.Parallel()
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	good := setup(t, w)
	p := good.paidPayment(t, 500)
	before := good.count(t, "outbox")
	ledger := good.count(t, "ledger_entries")

	bad, err := app.NewService(app.Config{Pool: good.schema.Pool, Events: failingPublisher{w}})
	require.NoError(t, err)
	_, err = bad.Refund(context.Background(), p.ID, nil)
	require.ErrorIs(t, err, errPublish)

	got, err := good.svc.GetPayment(context.Background(), p.ID)
	require.NoError(t, err)
	require.Equal(t, app.StatusPaid, got.Status, "the refund must not commit without its event")
	require.Equal(t, int64(2), got.Version)
	require.Equal(t, before, good.count(t, "outbox"))
	require.Equal(t, ledger, good.count(t, "ledger_entries"))
}

func TestCommandWritesBalancedLedger(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.paidPayment(t, 1000)
	half := int64(400)
	_, err := b.svc.Refund(context.Background(), p.ID, &half)
	require.NoError(t, err)

	var txs, unbalanced int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `
		SELECT count(*), count(*) FILTER (WHERE s <> 0)
		FROM (SELECT transaction_id, sum(amount) AS s FROM ledger_entries GROUP BY transaction_id) t`).Scan(&txs, &unbalanced))
	require.Equal(t, 2, txs)
	require.Zero(t, unbalanced)

	var cash int64
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(),
		`SELECT sum(amount) FROM ledger_entries WHERE account = 'psp:cash'`).Scan(&cash))
	require.Equal(t, int64(600), cash)
}

// The database refuses an unbalanced ledger transaction at commit, even when
// code other than ours writes it.
func TestDatabaseRefusesUnbalancedLedger(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := b.paidPayment(t, 1000)
	ctx := context.Background()

	err := pgx.BeginFunc(ctx, b.schema.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ledger_transactions (id, payment_id, kind, created_at)
			VALUES ('00000000-0000-7000-8000-000000000001', $1, 'bogus', now())`, p.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (transaction_id, account, amount, currency) VALUES
			('00000000-0000-7000-8000-000000000001', 'psp:cash', 100, 'EUR'),
			('00000000-0000-7000-8000-000000000001', 'merchant:x:payable', -99, 'EUR')`)
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "ledger_entries_balanced", pgErr.ConstraintName)
	require.Equal(t, 2, b.count(t, "ledger_entries"), "only the capture's two entries remain")

	// Altering a committed entry is refused too.
	_, err = b.schema.Pool.Exec(ctx, `UPDATE ledger_entries SET amount = amount + 1 WHERE account = 'psp:cash'`)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "ledger_entries_balanced", pgErr.ConstraintName)
}

func TestCommandsInCallerTransactionRollBackTogether(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	m, err := b.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/hooks"})
	require.NoError(t, err)

	errAbort := errors.New("caller aborts")
	err = b.svc.InTx(ctx, func(tx pgx.Tx) error {
		p, err := b.svc.CreatePaymentTx(ctx, tx, app.NewPayment{MerchantID: m.ID, Amount: 10, Currency: "USD"})
		if err != nil {
			return err
		}
		if _, err := b.svc.PayTx(ctx, tx, p.ID); err != nil {
			return err
		}
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	require.Zero(t, b.count(t, "payments"))
	require.Zero(t, b.count(t, "outbox"))
	require.Zero(t, b.count(t, "ledger_entries"))
}
