package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
)

// ClaimDeadConfig configures the claim-cost-without-vacuum benchmark.
type ClaimDeadConfig struct {
	// DatabaseURL is where fresh schemas are made. Required.
	DatabaseURL string
	// Redis is the broker. Required.
	Redis *redis.Client
	// Drain is how many new rows each dead-entry run drains. Defaults to
	// 20,000.
	Drain int
	// Dead are the dead-entry counts left in the pending-rows index before
	// each drain; the first is the baseline. Defaults to 0, 1M, 5M.
	Dead []int
	// Backlogs are the backlog sizes drained whole; the last one's rate is
	// compared to the first's. Defaults to 1M, 5M.
	Backlogs []int
	// Compare also drains each dead-entry case with a forwarder that claims
	// from the oldest pending row every time (FullClaimInterval of 1ns, the
	// claim before the low-water mark), in the same schema.
	Compare bool
	Out     io.Writer
}

// ClaimDead measures what dead entries in the pending-rows index cost the
// forwarder when vacuum does not run: autovacuum is off on the outbox, rows
// are seeded pending and then marked published in big set-based statements
// (their old versions stay in the partial index, dead), then ANALYZEd, never
// vacuumed.
func ClaimDead(ctx context.Context, cfg ClaimDeadConfig) error {
	if cfg.Drain <= 0 {
		cfg.Drain = 20_000
	}
	if len(cfg.Dead) == 0 {
		cfg.Dead = []int{0, 1_000_000, 5_000_000}
	}
	if len(cfg.Backlogs) == 0 {
		cfg.Backlogs = []int{1_000_000, 5_000_000}
	}
	out := cfg.Out
	fmt.Fprintf(out, "claim cost without vacuum (autovacuum off on outbox, rows ANALYZEd, never vacuumed)\n\n")
	fmt.Fprintf(out, "draining %d new rows behind N dead entries of the pending-rows index:\n", cfg.Drain)
	var base, baseFull time.Duration
	for i, dead := range cfg.Dead {
		took, full, err := drainBehindDead(ctx, cfg, dead)
		if err != nil {
			return fmt.Errorf("drain behind %d dead entries: %w", dead, err)
		}
		if i == 0 {
			base, baseFull = took, full
		}
		fmt.Fprintf(out, "  %9d dead  %6.2f s  %5.2fx of the first", dead, took.Seconds(), took.Seconds()/base.Seconds())
		if cfg.Compare {
			fmt.Fprintf(out, "   | claim from the oldest every time: %6.2f s  %5.2fx", full.Seconds(), full.Seconds()/baseFull.Seconds())
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "\ndraining a whole backlog (no dead entries before it):\n")
	var first float64
	for i, n := range cfg.Backlogs {
		rate, err := drainBacklog(ctx, cfg, n)
		if err != nil {
			return fmt.Errorf("drain a %d backlog: %w", n, err)
		}
		if i == 0 {
			first = rate
		}
		fmt.Fprintf(out, "  %9d rows  %8.0f rows/s  %5.2fx of the first\n", n, rate, rate/first)
	}
	return nil
}

// seedDead leaves n dead entries at the head of outbox_pending_idx: rows
// inserted pending, then marked published, 200,000 per statement.
func seedDead(ctx context.Context, pool *pgxpool.Pool, topic string, n int) error {
	for done := 0; done < n; done += 200_000 {
		k := min(200_000, n-done)
		if _, err := pool.Exec(ctx, `
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			SELECT gen_random_uuid(), $1, 'payment', 'old-' || (g % 1000), $3 + g, 'payment.paid', $2::jsonb, now()
			FROM generate_series(1, $4) g`, topic, benchPayload, done, k); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE published_at IS NULL`); err != nil {
			return err
		}
	}
	return nil
}

func seedPending(ctx context.Context, pool *pgxpool.Pool, topic string, n, fromVersion int) error {
	for done := 0; done < n; done += 200_000 {
		k := min(200_000, n-done)
		if _, err := pool.Exec(ctx, `
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			SELECT gen_random_uuid(), $1, 'payment', 'agg-' || (g % 1000), $3::int + g / 1000 + 1, 'payment.paid', $2::jsonb, now()
			FROM generate_series($4::int, $4::int + $5::int - 1) g ORDER BY g`, topic, benchPayload, fromVersion, done, k); err != nil {
			return err
		}
	}
	return nil
}

func noVacuumSchema(ctx context.Context, cfg ClaimDeadConfig) (*pgxpool.Pool, func(), error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 8)
	if err != nil {
		return nil, nil, err
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = off)`); err != nil {
		drop()
		return nil, nil, err
	}
	return pool, drop, nil
}

// drainBehindDead drains cfg.Drain rows behind dead dead entries, and, with
// cfg.Compare, as many again with the claim from the oldest pending row
// every time, in the same schema (20,000 more dead entries, a rounding
// error next to the seeded ones).
func drainBehindDead(ctx context.Context, cfg ClaimDeadConfig, dead int) (took, full time.Duration, err error) {
	pool, drop, err := noVacuumSchema(ctx, cfg)
	if err != nil {
		return 0, 0, err
	}
	defer drop()
	topic := "bench.dead." + fmt.Sprint(time.Now().UnixNano())
	defer cfg.Redis.Del(context.WithoutCancel(ctx), topic)
	if err := seedDead(ctx, pool, topic, dead); err != nil {
		return 0, 0, err
	}
	run := func(fullEvery time.Duration, fromVersion int) (time.Duration, error) {
		if err := seedPending(ctx, pool, topic, cfg.Drain, fromVersion); err != nil {
			return 0, err
		}
		if err := analyzeAndWalk(ctx, pool); err != nil {
			return 0, err
		}
		before, err := cfg.Redis.XLen(ctx, topic).Result()
		if err != nil {
			return 0, err
		}
		return timeDrain(ctx, cfg.Redis, pool, topic, before+int64(cfg.Drain), fullEvery)
	}
	if took, err = run(0, 0); err != nil {
		return 0, 0, err
	}
	if cfg.Compare {
		if full, err = run(time.Nanosecond, cfg.Drain/1000+1); err != nil {
			return 0, 0, err
		}
	}
	return took, full, nil
}

// analyzeAndWalk ANALYZEs the outbox, then walks the pending-rows index once
// from its head, as the first claim of any forwarder would: that walk marks
// the dead entries killed (LP_DEAD), so every timed run, whichever goes
// first, finds the index in the same state; then it checkpoints.
func analyzeAndWalk(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `ANALYZE outbox`); err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`); err != nil {
		return err
	}
	var id int64
	if err := tx.QueryRow(ctx, `SELECT id FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT 1`).Scan(&id); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	// Seeding writes hundreds of megabytes of WAL; without a checkpoint
	// here the one it triggers lands inside whichever drain comes first
	// and its full-page writes are charged to that drain alone.
	_, err = pool.Exec(ctx, `CHECKPOINT`)
	return err
}

func drainBacklog(ctx context.Context, cfg ClaimDeadConfig, n int) (float64, error) {
	pool, drop, err := noVacuumSchema(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer drop()
	topic := "bench.backlog." + fmt.Sprint(time.Now().UnixNano())
	defer cfg.Redis.Del(context.WithoutCancel(ctx), topic)
	if err := seedPending(ctx, pool, topic, n, 0); err != nil {
		return 0, err
	}
	if err := analyzeAndWalk(ctx, pool); err != nil {
		return 0, err
	}
	took, err := timeDrain(ctx, cfg.Redis, pool, topic, int64(n), 0)
	if err != nil {
		return 0, err
	}
	return float64(n) / took.Seconds(), nil
}

// timeDrain runs one forwarder until the stream holds want entries.
func timeDrain(ctx context.Context, rdb *redis.Client, pool *pgxpool.Pool, topic string, want int64, fullEvery time.Duration) (time.Duration, error) {
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	if err != nil {
		return 0, err
	}
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Logger: quietLogger(), FullClaimInterval: fullEvery})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	err = waitStreamFor(ctx, rdb, topic, want, 30*time.Minute)
	took := time.Since(start)
	cancel()
	if rerr := <-done; err == nil {
		err = rerr
	}
	return took, err
}

// waitStreamFor waits until stream holds n entries, for at most timeout: a
// 5 million backlog on a loaded 2-core machine takes longer than
// waitStream's 10 minutes.
func waitStreamFor(ctx context.Context, rdb *redis.Client, stream string, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := rdb.XLen(ctx, stream).Result()
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stream %s holds %d of %d entries after %s", stream, got, n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
