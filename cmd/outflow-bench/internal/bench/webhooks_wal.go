package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

// WebhooksWALConfig configures [WebhooksWAL].
type WebhooksWALConfig struct {
	DatabaseURL string
	Accounts    int // each with two endpoints
	Events      int
	Out         io.Writer
}

// WebhooksWAL measures what a webhook costs the database: the WAL its
// tables get per event (pg_waldump by relation, from a CHECKPOINT,
// full-page images included), from the fan-out's insert to the delivery's
// settle, every endpoint healthy; then the dead tuples left and the bytes
// stored per event. Each event goes to its account's two endpoints.
func WebhooksWAL(ctx context.Context, cfg WebhooksWALConfig) error {
	pool, drop, err := SchemaSets(ctx, cfg.DatabaseURL, 16, nil, schema.Set())
	if err != nil {
		return err
	}
	defer drop()
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	if _, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (id, account_id, url, secret)
		SELECT gen_random_uuid(), 'acct_' || (g / 2), $1 || '/' || g, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'
		FROM generate_series(0, $2 - 1) g`, rcv.URL, 2*cfg.Accounts); err != nil {
		return fmt.Errorf("insert endpoints: %w", err)
	}
	snd, stopSender := runSender(ctx, pool, sender.Config{AllowPrivate: true, Logger: quietLogger(),
		Client: &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}})
	defer stopSender()

	rng := rand.New(rand.NewPCG(27, 5))
	msgs := make([]webhooks.Message, cfg.Events)
	for i := range msgs {
		a := rng.IntN(cfg.Accounts)
		msgs[i] = webhooks.Message{ID: uuid.NewString(), AccountID: fmt.Sprintf("acct_%d", a), EventType: "payment.paid",
			OccurredAt: time.Now(), SchemaVersion: 1,
			Payload: json.RawMessage(fmt.Sprintf(`{"payment_id":%q,"merchant_id":"acct_%d","amount":1250,"currency":"EUR"}`,
				uuid.NewString(), a))}
	}
	meter, err := newWALMeter(ctx, pool)
	if err != nil {
		return err
	}
	start, err := meter.mark(ctx)
	if err != nil {
		return err
	}
	// Four producers, five events a transaction (a consumer's batch), each
	// commit waking the Sender as the fan-out handler does.
	const producers, perTx = 4, 5
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		perr error
	)
	for p := range producers {
		wg.Go(func() {
			for i := p * perTx; i < len(msgs); i += producers * perTx {
				batch := msgs[i:min(i+perTx, len(msgs))]
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for _, m := range batch {
						if _, err := fanout.Enqueue(ctx, tx, m, fanout.Target{}, ""); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					mu.Lock()
					perr = err
					mu.Unlock()
					return
				}
				snd.Wake()
			}
		})
	}
	wg.Wait()
	if perr != nil {
		return fmt.Errorf("enqueue: %w", perr)
	}
	want := 2 * cfg.Events
	var n int
	err = poll.Until(ctx, 100*time.Millisecond, 5*time.Minute, func() (bool, error) {
		err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'delivered'`).Scan(&n)
		return n == want, err
	})
	if errors.Is(err, poll.ErrTimeout) {
		var leased, due int
		_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE lease_token IS NOT NULL), count(*) FILTER (WHERE next_attempt_at <= now())
			FROM webhook_endpoint_deliveries WHERE status = 'pending'`).Scan(&leased, &due)
		err = fmt.Errorf("%d of %d deliveries made in 5 minutes (pending: %d leased, %d due)", n, want, leased, due)
	}
	if err != nil {
		return err
	}
	stopSender() // its last settles are in
	var attempts, lost int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE lease_lost) FROM webhook_endpoint_attempts`).
		Scan(&attempts, &lost); err != nil {
		return err
	}
	if attempts != want {
		fmt.Fprintf(cfg.Out, "  (%d attempts for %d deliveries, %d of them after a lease was lost)\n", attempts, want, lost)
	}
	by, err := meter.since(ctx, start)
	if err != nil {
		return err
	}
	table, total := walTable(by, cfg.Events, "webhook_")
	// Every dead version the run made, pruned since or not: what vacuum
	// and pruning have to clean. event-cost's deadTuples (pgstattuple)
	// counts only those not yet pruned: 0.8 an event here against 3.9
	// (a delivery is inserted, leased and settled: two dead versions).
	var dead, stored int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
		WHERE schemaname = current_schema() AND relname LIKE 'webhook_%'`).Scan(&dead); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname IN
		      ('webhook_messages', 'webhook_endpoint_deliveries', 'webhook_endpoint_attempts')`).Scan(&stored); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "webhooks-wal: %d events to %d accounts x 2 endpoints (%d deliveries), every endpoint healthy\n"+
		"  WAL of the webhook tables (pg_waldump by relation, from a CHECKPOINT, full-page images included; commit records left out):\n"+
		"  %.0f B/event (%.0f B/delivery)\n%s"+
		"  dead tuples left in the webhook tables: %d (%.1f per event, before autovacuum)\n"+
		"  stored (messages, deliveries, attempts, with indexes and TOAST): %.0f B/event\n",
		cfg.Events, cfg.Accounts, want, total, total/2, table, dead, float64(dead)/float64(cfg.Events),
		float64(stored)/float64(cfg.Events))
	return nil
}
