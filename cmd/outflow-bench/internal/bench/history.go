package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/app/paymentevents"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/internal/poll"
)

// HistoryConfig configures [History].
type HistoryConfig struct {
	DatabaseURL string
	RedisURL    string
	// Processed and Aggregates are the rows seeded in processed_messages
	// and consumer_aggregate_versions of the history schema.
	Processed  int
	Aggregates int
	// Backlog is how many events each drain moves; Rounds how many drains
	// each schema gets, alternating which goes first.
	Backlog int
	Rounds  int
	Out     io.Writer
}

// History measures what a long history costs the default consumer: the
// same drain (SyncAnalytics behind the middleware, default MaxBatch, the
// worker's Redis Streams subscriber, events already on the stream) into a
// freshly migrated schema and into one whose processed_messages and
// consumer_aggregate_versions already hold Processed and Aggregates rows
// of the same consumer, in the same run. The seeded message ids are
// time-ordered like the UUIDv7 ids events carry, spread over the 14 days
// before the run (inside the default retention), so the drained ids sort
// after them, as in production.
func History(ctx context.Context, cfg HistoryConfig) error {
	out := cfg.Out
	empty, dropEmpty, err := Schema(ctx, cfg.DatabaseURL, 16)
	if err != nil {
		return err
	}
	defer dropEmpty()
	hist, dropHist, err := Schema(ctx, cfg.DatabaseURL, 16)
	if err != nil {
		return err
	}
	defer dropHist()

	fmt.Fprintf(out, "history: seeding %d processed_messages rows and %d consumer_aggregate_versions rows...\n", cfg.Processed, cfg.Aggregates)
	start := time.Now()
	if err := seedHistory(ctx, hist, cfg.Processed, cfg.Aggregates); err != nil {
		return err
	}
	var size string
	if err := hist.QueryRow(ctx, `SELECT pg_size_pretty(pg_total_relation_size('processed_messages') + pg_total_relation_size('consumer_aggregate_versions'))`).Scan(&size); err != nil {
		return err
	}
	fmt.Fprintf(out, "  seeded in %s (%s with indexes)\n\n", time.Since(start).Round(time.Second), size)

	rdb, err := redisstreams.NewClient(ctx, cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	if err != nil {
		return err
	}
	n := cfg.Backlog / 3 * 3 // whole payments
	fmt.Fprintf(out, "| round | empty database, events/s | with history, events/s | ratio |\n| --- | ---: | ---: | ---: |\n")
	var (
		secs   [2]time.Duration
		ratios []float64
	)
	for r := range cfg.Rounds {
		var rates [2]float64
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			pool := []*pgxpool.Pool{empty, hist}[i]
			d, err := drainConsumer(ctx, cfg, pool, rdb, broker)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, []string{"empty", "history"}[i], err)
			}
			secs[i] += d
			rates[i] = float64(n) / d.Seconds()
		}
		ratios = append(ratios, rates[1]/rates[0])
		fmt.Fprintf(out, "| %d | %.0f | %.0f | %.2fx |\n", r+1, rates[0], rates[1], rates[1]/rates[0])
	}
	e := float64(n*cfg.Rounds) / secs[0].Seconds()
	h := float64(n*cfg.Rounds) / secs[1].Seconds()
	slices.Sort(ratios)
	fmt.Fprintf(out, "| all | %.0f | %.0f | %.2fx |\n\nwith history / empty: %.2fx over all rounds, median of the rounds %.2fx\n\n",
		e, h, h/e, h/e, ratios[len(ratios)/2])
	// The structural cost, free of the machine's noise: the shared buffers
	// the claim's two index inserts touch in each schema.
	fmt.Fprintf(out, "| buffers touched by one claim's inserts | empty | with history |\n| --- | ---: | ---: |\n")
	for _, q := range []struct{ name, sql string }{
		{"processed_messages (new message)", `INSERT INTO processed_messages (message_id, consumer) VALUES ($1, 'sync-analytics') ON CONFLICT DO NOTHING`},
		{"consumer_aggregate_versions (new aggregate)", `INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version) VALUES ('sync-analytics', 'payment', 'pay-' || $1::text, 1) ON CONFLICT DO NOTHING`},
	} {
		var touched [2]int
		for i, pool := range []*pgxpool.Pool{empty, hist} {
			if touched[i], err = buffersTouched(ctx, pool, q.sql); err != nil {
				return err
			}
		}
		fmt.Fprintf(out, "| %s | %d | %d |\n", q.name, touched[0], touched[1])
	}
	fmt.Fprintln(out)
	return nil
}

// buffersTouched runs sql (with a new UUIDv7 as $1) under EXPLAIN ANALYZE on
// one connection, in transactions it rolls back, and returns the shared buffers it hit or
// read.
func buffersTouched(ctx context.Context, pool *pgxpool.Pool, sql string) (int, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	n := 0
	// The last of three: the first may load the session's caches.
	for range 3 {
		if n, err = explainBuffers(ctx, conn, sql); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func explainBuffers(ctx context.Context, conn *pgxpool.Conn, sql string) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		}
	}
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, uuid.Must(uuid.NewV7())).Scan(&raw); err != nil {
		return 0, fmt.Errorf("explain: %w", err)
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) == 0 {
		return 0, fmt.Errorf("explain output: %w", err)
	}
	return plan[0].Plan.Hit + plan[0].Plan.Read, nil
}

// seedHistory fills processed_messages with processed rows and
// consumer_aggregate_versions with aggregates rows of sync-analytics. The
// primary key and the index of processed_messages are dropped for the load
// and built again after it, which is many times faster than maintaining
// them row by row.
func seedHistory(ctx context.Context, pool *pgxpool.Pool, processed, aggregates int) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// A message id: 48 bits of milliseconds (one every 120 ms from 14
	// days ago), then the version nibble and md5 bits, as UUIDv7 lays
	// them out.
	stmts := []string{
		`SET maintenance_work_mem = '256MB'`,
		`ALTER TABLE processed_messages DROP CONSTRAINT processed_messages_pkey`,
		`DROP INDEX processed_messages_processed_at_idx`,
		fmt.Sprintf(`
		INSERT INTO processed_messages (message_id, consumer, processed_at)
		SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
		       'sync-analytics', to_timestamp(ms / 1000.0)
		FROM generate_series(1, %d) g,
		     LATERAL (SELECT (extract(epoch FROM now() - interval '14 days') * 1000)::bigint + g * 120 AS ms,
		                     md5(g::text) AS h) x`, processed),
		`ALTER TABLE processed_messages ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (message_id, consumer)`,
		`CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at)`,
		fmt.Sprintf(`
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version, prev_version, updated_at)
		SELECT 'sync-analytics', 'payment', 'hist-' || g, 1 + g %% 3, g %% 3, now() - (g %% 1209600) * interval '1 second'
		FROM generate_series(1, %d) g`, aggregates),
		`VACUUM ANALYZE processed_messages`,
		`VACUUM ANALYZE consumer_aggregate_versions`,
		// Flush the load now, not while the drains run.
		`CHECKPOINT`,
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("seed history: %w", err)
		}
	}
	return nil
}

// drainConsumer puts cfg.Backlog payment events (created, paid, refunded,
// per payment, in order) on a new stream, then runs the default worker
// with SyncAnalytics until the projection has counted every one of them.
// It returns the time from the worker's start.
func drainConsumer(ctx context.Context, cfg HistoryConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, broker *redisstreams.Broker) (time.Duration, error) {
	run := uuid.NewString()[:8]
	topic := "bench." + run
	defer rdb.Del(context.WithoutCancel(ctx), broker.Streams(topic)...)
	payments := cfg.Backlog / 3
	var batch []forwarder.Outgoing
	flush := func() error {
		for _, err := range broker.Publish(ctx, batch) {
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
		}
		batch = batch[:0]
		return nil
	}
	for p := range payments {
		id := fmt.Sprintf("pay-%s-%d", run, p)
		for v := int64(1); v <= 3; v++ {
			ev, err := events.New(ctx, events.Aggregate{Type: paymentevents.AggregateType, ID: id, Version: v}, benchPayment(p, v))
			if err != nil {
				return 0, err
			}
			m, err := ev.Message(ctx)
			if err != nil {
				return 0, err
			}
			batch = append(batch, forwarder.Outgoing{Topic: topic, AggregateID: id, Message: m})
		}
		if len(batch) >= 999 {
			if err := flush(); err != nil {
				return 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}

	var paid0, refunded0 int64
	totals := func() (paid, refunded int64, err error) {
		err = pool.QueryRow(ctx, `SELECT coalesce(sum(paid_count), 0), coalesce(sum(refunded_amount), 0) FROM merchant_stats_daily`).Scan(&paid, &refunded)
		return paid, refunded, err
	}
	paid0, refunded0, err := totals()
	if err != nil {
		return 0, err
	}

	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		return 0, err
	}
	backend, err := redisBackend(ctx, cfg.RedisURL)
	if err != nil {
		return 0, err
	}
	defer backend.Close()
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg, Logger: quietLogger()})
	if err != nil {
		return 0, err
	}
	h := handlers.SyncAnalytics()
	h.Topic = topic
	if err := w.Add(h); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	start := time.Now()
	wg.Go(func() { _ = w.Run(rctx) })
	var paid int64
	err = poll.Until(ctx, 20*time.Millisecond, 10*time.Minute, func() (bool, error) {
		p, refunded, err := totals()
		paid = p - paid0
		// Every payment's refund is its last version: once each is
		// counted, every event was handled, in order.
		if err == nil && (paid > int64(payments) || refunded-refunded0 > int64(payments)*1000) {
			err = fmt.Errorf("the projection counted more than it was sent: %d paid of %d", paid, payments)
		}
		return paid == int64(payments) && refunded-refunded0 == int64(payments)*1000, err
	})
	if errors.Is(err, poll.ErrTimeout) {
		err = fmt.Errorf("only %d of %d payments counted in 10 minutes", paid, payments)
	}
	if err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
