package cli_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

// kill -9 of a worker holding unacknowledged messages loses nothing and
// applies nothing twice: a second worker claims the dead one's entries after
// its --claim-idle and finishes. The effects show it: the analytics
// projection equals the payments' sums, the merchant received a webhook for
// every paid or refunded event and no other, a second copy only of one the
// dead worker may have been sending when it died.
func TestKilledWorkerLosesNothing(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	// The commands name streams after their topics ("payments"): a Redis of
	// the test's own keeps them apart from every other test's.
	redisSrv := testservers.StartRedis(t)
	ropts, err := redis.ParseURL(redisSrv.URL)
	require.NoError(t, err)
	rdb := redis.NewClient(ropts)
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()

	site := &receivedWebhooks{at: map[string][]time.Time{}}
	srv := httptest.NewServer(site)
	t.Cleanup(srv.Close)
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: s.Pool, Events: w, AllowPrivateWebhooks: true}) // the merchant is on 127.0.0.1
	require.NoError(t, err)
	m, err := svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: srv.URL + "/hooks"})
	require.NoError(t, err)
	site.mu.Lock()
	site.secret = m.WebhookSecret
	site.mu.Unlock()

	// 400 payments (934 events), committed 100 to a transaction; what the
	// projection must show is summed as they are made. Enough for the kill
	// to find the worker mid-run, a quarter through and holding entries
	// (the wait below insists on both), with duplicates among them; 1,000
	// proved no more and took 50 s, most of it draining after the kill.
	want := app.CurrencyStats{Currency: "EUR"}
	for batch := range 4 {
		require.NoError(t, svc.InTx(ctx, func(tx pgx.Tx) error {
			for i := batch * 100; i < (batch+1)*100; i++ {
				pay, err := svc.CreatePaymentTx(ctx, tx, app.NewPayment{MerchantID: m.ID, Amount: int64(100 + i), Currency: "EUR"})
				if err != nil {
					return err
				}
				if i%5 == 0 {
					continue // stays pending
				}
				if _, err := svc.PayTx(ctx, tx, pay.ID); err != nil {
					return err
				}
				want.PaidCount++
				want.PaidAmount = want.PaidAmount.Add(pay.Amount)
				if i%3 == 0 {
					half := pay.Amount / 2
					if _, err := svc.RefundTx(ctx, tx, pay.ID, &half); err != nil {
						return err
					}
					if _, err := svc.RefundTx(ctx, tx, pay.ID, nil); err != nil {
						return err
					}
					want.RefundedAmount = want.RefundedAmount.Add(pay.Amount)
				}
			}
			return nil
		}))
	}
	var events int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&events))
	webhooks := map[string]bool{}
	rows, err := s.Pool.Query(ctx, `SELECT message_id::text FROM outbox WHERE event_type IN ($1, $2)`, paymentevents.PaidType, paymentevents.RefundedType)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		webhooks[id] = true
	}
	require.NoError(t, rows.Err())

	env := map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL, "WEBHOOK_ALLOW_PRIVATE": "true"}
	start := func(args ...string) (*exec.Cmd, *outflowtest.LogBuffer) {
		cmd := command(env, args...)
		var stderr outflowtest.LogBuffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		return cmd, &stderr
	}
	fwd, _ := start("forward", "--metrics-addr", "", "--poll-interval", "50ms")
	t.Cleanup(func() { _ = fwd.Process.Signal(syscall.SIGTERM); _ = fwd.Wait() })

	groups := []string{"sync-analytics", "notify-merchant"}
	pending := func() map[string]int64 { // consumer -> entries it holds unacknowledged, over the groups
		out := map[string]int64{}
		for _, g := range groups {
			xp, err := rdb.XPending(ctx, app.PaymentsTopic, g).Result()
			if err != nil && strings.HasPrefix(err.Error(), "NOGROUP") {
				continue // the worker has not created it yet
			}
			require.NoError(t, err)
			for c, n := range xp.Consumers {
				out[c] += n
			}
		}
		return out
	}
	processed := func() (n int) {
		// Handled: the consumer's version of the row's aggregate reached it.
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox o JOIN consumer_aggregate_versions v
			ON v.consumer = 'sync-analytics' AND v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id
			AND v.version >= o.aggregate_version`).Scan(&n))
		return n
	}

	first, firstLog := start("worker", "--claim-idle", "30s")
	t.Cleanup(func() { _ = first.Process.Kill(); _ = first.Wait() })
	// Killed mid-run, while it holds messages it has not acknowledged.
	outflowtest.WaitFor(t, 60*time.Second, "the first worker mid-run, holding messages", func() bool {
		n := processed()
		var held int64
		for _, c := range pending() {
			held += c
		}
		return n >= events/4 && n < events && held > 0
	})
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	killedAt := time.Now()
	held := pending()
	require.Len(t, held, 1, "only the first worker has read: %s", firstLog.String())
	for dead, n := range held {
		require.Positive(t, n, "the killed worker held unacknowledged messages")
		t.Logf("killed after %d of %d events, holding %d entries unacknowledged, %d of them already committed (their redelivery is a duplicate)",
			processed(), events, n, committedHeld(t, rdb, s.Pool, groups, dead))
	}

	second, _ := start("worker", "--claim-idle", "1s")
	t.Cleanup(func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() })
	stats := func() app.CurrencyStats {
		st, err := svc.GetMerchantStats(ctx, m.ID)
		require.NoError(t, err)
		if len(st.ByCurrency) == 0 {
			return app.CurrencyStats{Currency: "EUR"}
		}
		return st.ByCurrency[0]
	}
	outflowtest.WaitFor(t, 90*time.Second, "every event handled and every webhook delivered", func() bool {
		var left int
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT (SELECT count(*) FROM outbox_state WHERE NOT published)
			     + (SELECT count(*) FROM webhook_endpoint_deliveries WHERE status <> 'delivered')
			     + (SELECT count(*) FROM dead_letters WHERE status IN ('retrying', 'held'))
			     + (SELECT count(*) FROM outbox o WHERE (SELECT count(*) FROM consumer_aggregate_versions v
			        WHERE v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id AND v.version >= o.aggregate_version) < 2)`,
		).Scan(&left))
		for _, n := range pending() {
			left += int(n)
		}
		return left == 0 && site.count() >= len(webhooks)
	})

	require.Equal(t, want, stats(), "each paid and refunded event counted once by the projection")
	var open int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE status IN ('retrying', 'dead', 'held')`).Scan(&open))
	require.Zero(t, open, "no message left parked")
	site.mu.Lock()
	defer site.mu.Unlock()
	var repeats int
	for id, at := range site.at {
		require.True(t, webhooks[id], "webhook %s is for no paid or refunded event", id)
		if len(at) > 1 {
			// The sender records an attempt after the merchant answered:
			// only one the dead worker was sending may go out again.
			require.Len(t, at, 2, "webhook %s received %d times", id, len(at))
			require.True(t, at[0].Before(killedAt), "webhook %s repeated, its first copy after the kill", id)
			repeats++
		}
	}
	require.Len(t, site.at, len(webhooks), "a webhook for every paid or refunded event")
	require.Zero(t, site.unsigned, "every webhook verifies with the merchant's secret")
	t.Logf("%d events, %d webhooks, %d received twice (in flight at the kill); drained %s after the kill",
		events, len(webhooks), repeats, time.Since(killedAt).Round(time.Millisecond))
}

// receivedWebhooks is a merchant's endpoint: when each webhook id arrived,
// and how many did not verify with secret (when set).
type receivedWebhooks struct {
	mu       sync.Mutex
	at       map[string][]time.Time
	secret   string
	unsigned int
}

func (r *receivedWebhooks) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	id := req.Header.Get("webhook-id")
	r.at[id] = append(r.at[id], time.Now())
	if r.secret != "" && signing.Verify(r.secret, req.Header, body, time.Now(), 0) != nil {
		r.unsigned++
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *receivedWebhooks) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

// committedHeld counts the entries consumer holds unacknowledged whose
// message its group's consumer already handled (its aggregate's version
// reached it): killed between commit and acknowledgement.
func committedHeld(t *testing.T, rdb *redis.Client, pool *pgxpool.Pool, groups []string, consumer string) (n int) {
	t.Helper()
	ctx := context.Background()
	for _, g := range groups {
		pending, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: app.PaymentsTopic, Group: g, Start: "-", End: "+",
			Count: 100_000, Consumer: consumer}).Result()
		require.NoError(t, err)
		var ids []string
		for _, p := range pending {
			entries, err := rdb.XRange(ctx, app.PaymentsTopic, p.ID, p.ID).Result()
			require.NoError(t, err)
			for _, e := range entries {
				msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
				require.NoError(t, err)
				ids = append(ids, msg.UUID)
			}
		}
		var c int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox o JOIN consumer_aggregate_versions v
			ON v.consumer = $1 AND v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id
			AND v.version >= o.aggregate_version
			WHERE o.message_id::text = ANY($2)`, g, ids).Scan(&c))
		n += c
	}
	return n
}
