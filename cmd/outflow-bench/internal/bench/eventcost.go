package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/poll"
)

// EventCostConfig configures the event-cost benchmark.
type EventCostConfig struct {
	// DatabaseURL is where fresh schemas are made; the benchmark reads the
	// server's pg_wal, so it runs on the database's host. Required.
	DatabaseURL string
	// Retained are the histories the outbox holds before the measured
	// events: one run each. Defaults to 0 and 1M.
	Retained []int
	// EmptyHistory seeds the history with an empty payload instead of a
	// payment event's: 100M retained rows of ~580 B do not fit this
	// machine's disk, and what an event costs depends on the pages it
	// touches (the newest partition, the right edge of each index), not
	// on the width of the rows before it.
	EmptyHistory bool
	// Events is how many events each run writes, relays and retires.
	// Defaults to 20,000.
	Events int
	// Clients write the events concurrently, one event per transaction.
	// Defaults to 8.
	Clients int
	Out     io.Writer
}

// costEvent is a payment event of the size of benchPayload's (the
// retained rows'), metadata added by the writer: a row of about 580 B.
type costEvent struct {
	PaymentID      string `json:"payment_id"`
	MerchantID     string `json:"merchant_id"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	Status         string `json:"status"`
	RefundedAt     string `json:"refunded_at"`
	PaymentAmount  int64  `json:"payment_amount"`
	RefundedAmount int64  `json:"refunded_amount"`
}

func (costEvent) EventType() string { return "payment.paid" }

// EventCost measures what an event costs the database over its life in
// table mode, as a DBA reads it: the WAL of the outbox's relations
// (pg_waldump from a CHECKPOINT, full-page images included) for the
// write, the relay (a forwarder to a redis-server of the benchmark's own)
// and the retention that removes it (Purge dropping partitions, and a
// VACUUM after it to show it has nothing to do), the
// dead tuples each phase leaves in the outbox, and the bytes stored per
// retained row, with a history of Retained rows already there. Retained
// rows' aggregate ids increase with time, as UUIDv7 payment ids do, so
// new events land at the right edge of the aggregate index.
func EventCost(ctx context.Context, cfg EventCostConfig) error {
	if len(cfg.Retained) == 0 {
		cfg.Retained = []int{0, 1_000_000}
	}
	if cfg.Events <= 0 {
		cfg.Events = 20_000
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 8
	}
	rdb, stop, err := startRedis(ctx)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(cfg.Out, "event cost in table mode: WAL of the outbox's relations per event (pg_waldump from a CHECKPOINT, full-page images included), %d events by %d clients a run\n", cfg.Events, cfg.Clients)
	for _, retained := range cfg.Retained {
		if err := eventCostRun(ctx, cfg, retained, rdb); err != nil {
			return err
		}
	}
	return nil
}

func eventCostRun(ctx context.Context, cfg EventCostConfig, retained int, rdb *redis.Client) error {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, int32(cfg.Clients+4))
	if err != nil {
		return err
	}
	defer drop()
	topic := "cost." + uuid.NewString()[:8]
	defer rdb.Del(context.WithoutCancel(ctx), topic)
	payload := benchPayload
	if cfg.EmptyHistory {
		payload = `{}`
	}
	if err := seedRetained(ctx, pool, topic, payload, retained); err != nil {
		return err
	}
	meter, err := newWALMeter(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "\n  %d rows retained:\n", retained)

	// The measured events get partitions of their own, of their number of
	// ids, above the history's: retention can then drop theirs whole.
	if _, err := pool.Exec(ctx, `SELECT setval('outbox_id_seq', (
		SELECT max((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''?(\d+)''?\)'))[1]::bigint) - 1
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass))`); err != nil {
		return err
	}
	made, err := forwarder.EnsurePartitions(ctx, pool, int64(cfg.Events))
	if err != nil {
		return err
	}
	if len(made) == 0 {
		return errors.New("event cost: no partition made for the measured events")
	}
	eventsPartition := made[0]

	// Write.
	start, err := meter.mark(ctx)
	if err != nil {
		return err
	}
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	if err != nil {
		return err
	}
	if err := writeCostEvents(ctx, pool, w, retained, cfg.Events, cfg.Clients); err != nil {
		return err
	}
	write, err := costPhase(ctx, cfg, meter, pool, start, "write (the INSERT)")
	if err != nil {
		return err
	}

	// Relay.
	if start, err = meter.mark(ctx); err != nil {
		return err
	}
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	if err != nil {
		return err
	}
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Registerer: prometheus.NewRegistry(),
		Logger: quietLogger(), AuditInterval: -1})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	relayStart := time.Now()
	go func() { done <- f.Run(rctx) }()
	err = poll.Until(ctx, 5*time.Millisecond, 10*time.Minute, func() (bool, error) {
		n, err := rdb.XLen(ctx, topic).Result()
		return n >= int64(cfg.Events), err
	})
	relayTime := time.Since(relayStart)
	cancel()
	if err := errors.Join(err, <-done); err != nil { // Run records the cursor as it stops
		return err
	}
	relay, err := costPhase(ctx, cfg, meter, pool, start, "relay (claim, publish, cursor)")
	if err != nil {
		return err
	}
	// The drain's rate, start-up (a lease tick) included: compared across
	// the histories of one command, it says whether the relay slows as the
	// history grows.
	fmt.Fprintf(cfg.Out, "    relay rate: %.0f events/s (%d events in %s, from the forwarder's start)\n",
		float64(cfg.Events)/relayTime.Seconds(), cfg.Events, relayTime.Round(time.Millisecond))
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&pending); err != nil {
		return err
	}
	if pending != 0 {
		return fmt.Errorf("event cost: %d rows not published after the relay", pending)
	}

	var stored int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, eventsPartition).Scan(&stored); err != nil {
		return err
	}

	// Retention: the history goes as if older than the retention (a
	// cutoff an hour ahead: no row has to be aged by an UPDATE of the
	// benchmark's); the partitions drop whole; what vacuum finds after is
	// measured too.
	if start, err = meter.mark(ctx); err != nil {
		return err
	}
	if _, err := forwarder.Purge(ctx, pool, -time.Hour, 10_000); err != nil {
		return err
	}
	var left int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
		return err
	}
	if left != 0 {
		return fmt.Errorf("event cost: %d rows left after the purge", left)
	}
	purge, err := costPhase(ctx, cfg, meter, pool, start, "retention: Purge (partitions dropped)")
	if err != nil {
		return err
	}
	if start, err = meter.mark(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM outbox`); err != nil {
		return err
	}
	vacuum, err := costPhase(ctx, cfg, meter, pool, start, "retention: the VACUUM after it")
	if err != nil {
		return err
	}
	retire := purge + vacuum
	fmt.Fprintf(cfg.Out, "    whole life: %.0f B/event (write %.0f + relay %.0f + retention %.0f)\n", write+relay+retire, write, relay, retire)

	fmt.Fprintf(cfg.Out, "    stored: %.0f B per event (heap, TOAST and indexes of the events' partition)\n", float64(stored)/float64(cfg.Events))
	return nil
}

// costPhase prints the WAL since start by relation, and the outbox's dead
// tuples, and returns the outbox relations' bytes per event.
func costPhase(ctx context.Context, cfg EventCostConfig, meter *walMeter, pool *pgxpool.Pool, start, name string) (float64, error) {
	by, err := meter.since(ctx, start)
	if err != nil {
		return 0, err
	}
	table, total := walTable(by, cfg.Events, "outbox")
	dead, err := deadTuples(ctx, pool)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(cfg.Out, "    %s: %.0f B/event; dead tuples in outbox after it: %d\n%s", name, total, dead, table)
	return total, nil
}

// deadTuples counts the outbox's dead tuples with pgstattuple, which
// reads the table: the statistics views report with a delay.
func deadTuples(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pgstattuple`); err != nil {
		return 0, fmt.Errorf("dead tuples (pgstattuple, in postgresql-contrib): %w", err)
	}
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum((pgstattuple(inhrelid::regclass)).dead_tuple_count), 0)::bigint
		FROM pg_inherits WHERE inhparent = 'outbox'::regclass`).Scan(&n)
	return n, err
}

// seedRetained writes retained published rows, with the partitions'
// cursors past them, and vacuums: the history the measured events join.
func seedRetained(ctx context.Context, pool *pgxpool.Pool, topic, payload string, retained int) error {
	for done := 0; done < retained; done += 200_000 {
		k := min(200_000, retained-done)
		if _, err := pool.Exec(ctx, `
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7000-8000-000000000000')::uuid,
			       $1, 'payment', 'old-' || lpad(((g + $3) / 2)::text, 12, '0'), (g + $3) % 2 + 1, 'payment.paid', $2::jsonb, now()
			FROM generate_series(1, $4) g, LATERAL (SELECT lpad(to_hex(g + $3), 12, '0') AS h) x`, topic, payload, done, k); err != nil {
			return fmt.Errorf("seed history: %w", err)
		}
		if _, err := forwarder.EnsurePartitions(ctx, pool, 10_000_000); err != nil {
			return fmt.Errorf("seed history: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, `
		WITH sets AS (INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 16))
		INSERT INTO outbox_partitions (partition, published_through, published_high)
		SELECT g, coalesce(m, 0), coalesce(m, 0) FROM generate_series(0, 15) g, (SELECT max(id) AS m FROM outbox) x`); err != nil {
		return fmt.Errorf("seed history: %w", err)
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	return err
}

// writeCostEvents writes n events, one per transaction, by clients
// goroutines: a payment's two events, its aggregate id increasing with
// time as a UUIDv7's does.
func writeCostEvents(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer, retained, n, clients int) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	per := (n + clients - 1) / clients
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c * per; i < min(n, (c+1)*per); i++ {
				agg := fmt.Sprintf("new-%012d", retained+i/2)
				ev, err := events.New(ctx, events.Aggregate{Type: "payment", ID: agg, Version: int64(i%2 + 1)}, costEvent{
					PaymentID: uuid.NewString(), MerchantID: "01a236bd-1ee8-76bc-97f9-db64d791fd62", Amount: int64(i), Currency: "GBP",
					Status: "refunded", RefundedAt: "2026-12-02T12:31:34.482209Z", PaymentAmount: 13422, RefundedAmount: 13422})
				if err == nil {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) })
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
