package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
)

// ConsumerWALConfig configures [ConsumerWAL].
type ConsumerWALConfig struct {
	// DatabaseURL is where fresh schemas are made; the benchmark reads the
	// server's pg_wal, so it runs on the database's host. Required.
	DatabaseURL string
	// Payments is how many payments each run handles: created and paid,
	// and refunded for one in five (2.2 events a payment). Defaults to
	// 10,000.
	Payments int
	// Retained are the consumer's version rows already there when a run
	// starts (the history of aggregates it handled before), one run each.
	// Defaults to 0, 5M and 20M.
	Retained []int
	// Workers deliver the events concurrently, each its own payments in
	// version order. Defaults to 8.
	Workers int
	Out     io.Writer
}

// ConsumerWAL measures the WAL a handler's bookkeeping writes per event:
// payments' events go through one idempotency.Consumer whose handler does
// nothing, so that what is written is the consumer's own (the version
// rows, any dead letters, and processed_messages, which it no longer
// writes), charged by relation by pg_waldump from a CHECKPOINT, full-page
// images included, as in production after every checkpoint. Commit records
// are the handler's transaction's and are left out. The payments' ids are
// UUIDv7, as the application's, and the retained history's are older
// ones: new aggregates land at the right edge of the primary key.
func ConsumerWAL(ctx context.Context, cfg ConsumerWALConfig) error {
	if cfg.Payments <= 0 {
		cfg.Payments = 10_000
	}
	if len(cfg.Retained) == 0 {
		cfg.Retained = []int{0, 5_000_000, 20_000_000}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	events := cfg.Payments*2 + cfg.Payments/5
	fmt.Fprintf(cfg.Out, "consumer bookkeeping WAL per event and handler, by relation (pg_waldump from a CHECKPOINT, full-page images included),\n"+
		"%d payments, %d events (2.2 a payment), %d workers:\n", cfg.Payments, events, cfg.Workers)
	for _, retained := range cfg.Retained {
		total, table, size, err := consumerWALRun(ctx, cfg, retained, events)
		if err != nil {
			return fmt.Errorf("%d version rows retained: %w", retained, err)
		}
		fmt.Fprintf(cfg.Out, "  %d version rows retained (%s): %.0f B/event/handler\n%s", retained, size, total, table)
	}
	return nil
}

func consumerWALRun(ctx context.Context, cfg ConsumerWALConfig, retained, events int) (float64, string, string, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, int32(cfg.Workers+4))
	if err != nil {
		return 0, "", "", err
	}
	defer drop()
	if err := seedVersions(ctx, pool, retained); err != nil {
		return 0, "", "", err
	}
	var size string
	if err := pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_total_relation_size('consumer_aggregate_versions'))`).Scan(&size); err != nil {
		return 0, "", "", err
	}
	c, err := idempotency.NewConsumer(idempotency.Config{Pool: pool, Consumer: "sync-analytics", Logger: quietLogger()})
	if err != nil {
		return 0, "", "", err
	}
	h := c.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	// Each worker's payments, their events in version order: created for a
	// hundred, then paid for the same, refunded for one in five, as
	// payments move through their life a while apart.
	// The ids are made in one sequence, as payments are created one after
	// another, and dealt to the workers in turn: new aggregates land at the
	// right edge of the primary key, as UUIDv7 ids of live traffic do.
	ids := make([][]string, cfg.Workers)
	for p := range cfg.Payments {
		ids[p%cfg.Workers] = append(ids[p%cfg.Workers], uuid.Must(uuid.NewV7()).String())
	}
	msgs := make([][]*message.Message, cfg.Workers)
	for w := range cfg.Workers {
		for start := 0; start < len(ids[w]); start += 100 {
			chunk := ids[w][start:min(start+100, len(ids[w]))]
			for v := int64(1); v <= 3; v++ {
				for i, id := range chunk {
					if v == 3 && (start+i)%5 != 0 {
						continue
					}
					m, err := walEvent(ctx, id, v)
					if err != nil {
						return 0, "", "", err
					}
					msgs[w] = append(msgs[w], m)
				}
			}
		}
	}
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	meter, err := newWALMeter(ctx, pool)
	if err != nil {
		return 0, "", "", err
	}
	checkpoints := func() (n int64, err error) {
		err = pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n)
		return n, err
	}
	start, err := meter.mark(ctx)
	if err != nil {
		return 0, "", "", err
	}
	before, err := checkpoints()
	if err != nil {
		return 0, "", "", err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		herr error
	)
	for _, ms := range msgs {
		wg.Go(func() {
			for _, m := range ms {
				if _, err := h(m); err != nil {
					mu.Lock()
					herr = err
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if herr != nil {
		return 0, "", "", herr
	}
	after, err := checkpoints()
	if err != nil {
		return 0, "", "", err
	}
	if after != before {
		// Another checkpoint began during the run (the server is shared:
		// other sessions' WAL can request one): the pages touched after it
		// wrote a second full-page image. Said, not hidden.
		fmt.Fprintf(cfg.Out, "  (%d more checkpoint(s) during the run: their full-page images are in the figure below)\n", after-before)
	}
	var handled int
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(version), 0) FROM consumer_aggregate_versions
		WHERE updated_at > now() - interval '1 hour'`).Scan(&handled); err != nil {
		return 0, "", "", err
	}
	if handled != n {
		return 0, "", "", fmt.Errorf("%d of %d events applied", handled, n)
	}
	by, err := meter.since(ctx, start)
	if err != nil {
		return 0, "", "", err
	}
	delete(by, "(no relation)") // commit records: the handler's transaction's, which it pays with or without bookkeeping
	table, total := walTable(by, n, "consumer_aggregate_versions", "processed_messages", "dead_letters")
	return total, table, size, nil
}

// walEvent is payment id's event at version v, as the forwarder publishes
// it.
func walEvent(ctx context.Context, id string, v int64) (*message.Message, error) {
	now := time.Now()
	var p events.Payload
	switch v {
	case 1:
		p = paymentevents.Created{PaymentID: id, MerchantID: "merchant-1", Amount: 1000, Currency: "EUR", Status: "pending", CreatedAt: now}
	case 2:
		p = paymentevents.Paid{PaymentID: id, MerchantID: "merchant-1", Amount: 1000, Currency: "EUR", PaidAt: now}
	default:
		p = paymentevents.Refunded{PaymentID: id, MerchantID: "merchant-1", Amount: 1000, RefundedAmount: 1000, PaymentAmount: 1000,
			Currency: "EUR", Status: "refunded", RefundedAt: now}
	}
	ev, err := events.New(ctx, events.Aggregate{Type: paymentevents.AggregateType, ID: id, Version: v}, p)
	if err != nil {
		return nil, err
	}
	return ev.Message(ctx)
}

// seedVersions writes n version rows of the consumer, for aggregates it
// handled before: UUIDv7 ids, one per 10 ms back from now, older than any
// the run makes, at version 2 or 3, written in id order as they came (the
// heap at the table's fillfactor, 70 since migration 00026), then frozen
// and analysed so that the run starts from a settled table, not from the
// hint bits and visibility-map writes of the seed.
func seedVersions(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if n == 0 {
		return nil
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE consumer_aggregate_versions DROP CONSTRAINT consumer_aggregate_versions_pkey`); err != nil {
		return fmt.Errorf("seed versions: %w", err)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version, prev_version, updated_at)
		SELECT 'sync-analytics', 'payment',
		       substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12),
		       2 + (i % 5 = 0)::int, 1, now() - interval '1 day'
		FROM generate_series(1, $1::bigint) i,
		     LATERAL (SELECT lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - ($1::bigint - i) * 10), 12, '0') AS t,
		                     md5(i::text) AS r) x`, n)
	if err != nil {
		return fmt.Errorf("seed versions: %w", err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE consumer_aggregate_versions ADD CONSTRAINT consumer_aggregate_versions_pkey
		PRIMARY KEY (consumer, aggregate_type, aggregate_id)`); err != nil {
		return fmt.Errorf("seed versions: %w", err)
	}
	_, err = pool.Exec(ctx, `VACUUM (FREEZE, ANALYZE) consumer_aggregate_versions`)
	return err
}
