package app_test

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// A transaction that has queued a NOTIFY takes an instance-wide lock at
// commit, which serialises the commits of every producer in the PostgreSQL
// instance (issue 11: a third of the pay command's throughput at 16
// clients). These tests fail if a notification comes back into a
// producer's transaction, by any path: a statement the service sends, a
// trigger or rule on a table, a function in the schema, or, effect-based,
// a notification reaching the channel the forwarder used to LISTEN on.
func TestProducerTransactionsSendNoNotification(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	require.Empty(t, producerNotifications(t, s))
}

// The detector itself: with migration 00010 rolled back (the outbox_notify
// trigger of 00004 restored), every check above must see it.
func TestProducerNotificationDetectorSeesTheOldTrigger(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	// Roll back down to and including the migration that dropped the
	// trigger (00010), whatever came after it.
	db := s.OpenDB(t)
	for {
		r, err := migrations.Down(context.Background(), db)
		require.NoError(t, err)
		if r.Version <= 10 {
			require.Equal(t, int64(10), r.Version, "00010 dropped the trigger")
			break
		}
	}
	found := producerNotifications(t, s)
	require.Contains(t, strings.Join(found, "\n"), "trigger outbox_notify")
	require.Contains(t, strings.Join(found, "\n"), "received a notification")
}

var notifyRE = regexp.MustCompile(`(?i)\b(pg_notify|notify)\b`)

// producerNotifications runs the reference producer's commands on s and
// returns every way they notify, empty when they do not.
func producerNotifications(t *testing.T, s *outflowtest.Schema) []string {
	t.Helper()
	ctx := context.Background()
	var found []string

	// Static: every trigger, rule and function of the schema.
	rows, err := s.Pool.Query(ctx, `
		SELECT 'trigger ' || tg.tgname || ' on ' || c.relname || ': ' || pg_get_functiondef(tg.tgfoid)
		FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
		WHERE c.relnamespace = $1::regnamespace AND NOT tg.tgisinternal
		UNION ALL
		SELECT 'rule ' || rulename || ' on ' || tablename || ': ' || definition
		FROM pg_rules WHERE schemaname = $2
		UNION ALL
		SELECT 'function ' || p.proname || ': ' || p.prosrc
		FROM pg_proc p WHERE p.pronamespace = $1::regnamespace`, pgx.Identifier{s.Name}.Sanitize(), s.Name)
	require.NoError(t, err)
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, d := range defs {
		if notifyRE.MatchString(d) {
			found = append(found, d)
		}
	}

	// Effect: listen on the forwarder's old channel, run the commands
	// through a pool that records every statement, then send a sentinel
	// from another session. Notifications arrive in commit order, so any
	// the commands sent arrive before the sentinel: no sleep needed.
	channel := pgx.Identifier{"outflow_outbox:" + s.Name}.Sanitize()
	listener, err := pgx.Connect(ctx, s.URL)
	require.NoError(t, err)
	defer listener.Close(ctx)
	_, err = listener.Exec(ctx, "LISTEN "+channel)
	require.NoError(t, err)

	rec := &recorder{}
	pcfg, err := pgxpool.ParseConfig(s.URL)
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	defer pool.Close()
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: pool, Events: w})
	require.NoError(t, err)
	m, err := svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/hooks"})
	require.NoError(t, err)
	p, err := svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: 1000, Currency: "EUR"})
	require.NoError(t, err)
	_, err = svc.Pay(ctx, p.ID)
	require.NoError(t, err)
	amount := int64(400)
	_, err = svc.Refund(ctx, p.ID, &amount)
	require.NoError(t, err)
	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&events))
	require.Equal(t, 3, events, "the commands wrote their events")

	_, err = s.Pool.Exec(ctx, `SELECT pg_notify($1, 'sentinel')`, "outflow_outbox:"+s.Name)
	require.NoError(t, err)
	for {
		n, err := listener.WaitForNotification(ctx)
		require.NoError(t, err)
		if n.Payload == "sentinel" {
			break
		}
		found = append(found, "the forwarder's old channel received a notification from a producer's commit")
	}

	for _, q := range rec.statements() {
		if notifyRE.MatchString(q) {
			found = append(found, "statement: "+q)
		}
	}
	return found
}

// recorder keeps every statement a pool sends, batched or not.
type recorder struct {
	mu  sync.Mutex
	sql []string
}

func (r *recorder) add(q string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sql = append(r.sql, q)
}

func (r *recorder) statements() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sql...)
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(d.SQL)
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *recorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add(d.SQL)
}

func (r *recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
