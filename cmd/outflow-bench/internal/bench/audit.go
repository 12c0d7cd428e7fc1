package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/poll"
)

// AuditConfig configures the broker-loss audit benchmark.
type AuditConfig struct {
	// DatabaseURL is where fresh schemas are made. Required.
	DatabaseURL string
	// Backlog is the row count each throughput run drains. Defaults to
	// 50,000.
	Backlog int
	// Rounds is how many drains each side (audit off, on) makes,
	// alternating. Defaults to 3.
	Rounds int
	// Interval is the audit interval of the throughput runs: short, so that
	// its cost shows. Defaults to 1s.
	Interval time.Duration
	// Streams is the Redis streams per topic: each is audited. Defaults to
	// 16.
	Streams int
	// Lost is how many published rows the loss run repairs. Defaults to
	// 20,000.
	Lost int
	// RepairIntervals are the audit intervals of the loss runs. Defaults
	// to 1s and 20s (the default).
	RepairIntervals []time.Duration
	Out             io.Writer
}

// Audit measures the broker-loss audit on a redis-server of its own (it
// flushes it): the forwarder's drain throughput with the audit running
// against without it, alternating in the same run, a consumer group
// keeping up with each (so that the audit settles and trims as in
// production), the cost of a pass, and the time from a
// loss (FLUSHALL of every published entry) to every lost entry on the
// streams again.
func Audit(ctx context.Context, cfg AuditConfig) error {
	if cfg.Backlog <= 0 {
		cfg.Backlog = 50_000
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Streams <= 0 {
		cfg.Streams = 16
	}
	if cfg.Lost <= 0 {
		cfg.Lost = 20_000
	}
	if len(cfg.RepairIntervals) == 0 {
		cfg.RepairIntervals = []time.Duration{time.Second, 20 * time.Second}
	}
	rdb, stop, err := startRedis(ctx)
	if err != nil {
		return err
	}
	defer stop()
	out := cfg.Out
	fmt.Fprintf(out, "broker-loss audit (own redis-server, %d streams per topic): drain of %d rows, %d rounds per side, audit every %s\n",
		cfg.Streams, cfg.Backlog, cfg.Rounds, cfg.Interval)

	// The two sides drain at the same time, each its own schema and
	// streams, so that whatever else loads the machine loads both alike.
	var ratios, settleMs, idleMs, left []float64
	var passes float64
	for r := range cfg.Rounds {
		off, err := newAuditLane(ctx, cfg, rdb, cfg.Backlog, -1)
		if err != nil {
			return err
		}
		on, err := newAuditLane(ctx, cfg, rdb, cfg.Backlog, cfg.Interval)
		if err != nil {
			off.close()
			return err
		}
		var offRes, onRes auditRun
		var offErr, onErr error
		done := make(chan struct{})
		cctx, stopConsumers := context.WithCancel(ctx)
		consumed := make(chan error, 2)
		go func() { consumed <- consume(cctx, rdb, off.streams) }()
		go func() { consumed <- consume(cctx, rdb, on.streams) }()
		go func() { offRes, offErr = off.drain(ctx, rdb); close(done) }()
		onRes, onErr = on.drain(ctx, rdb)
		<-done
		stopConsumers()
		onErr = errors.Join(onErr, <-consumed, <-consumed)
		if err := errors.Join(offErr, onErr); err != nil {
			off.close()
			on.close()
			return err
		}
		settle, idle, receipts, err := on.passMs(ctx, rdb)
		off.close()
		on.close()
		if err != nil {
			return err
		}
		ratios = append(ratios, onRes.rate/offRes.rate)
		settleMs = append(settleMs, settle)
		idleMs = append(idleMs, idle)
		left = append(left, float64(receipts))
		passes += onRes.audits
		fmt.Fprintf(out, "  round %d: audit off %7.0f rows/s, on %7.0f rows/s (%.0f passes): %.3fx\n", r+1, offRes.rate, onRes.rate, onRes.audits, onRes.rate/offRes.rate)
	}
	fmt.Fprintf(out, "  on / off = %.3fx (median of %d rounds)\n", median(ratios), len(ratios))
	fmt.Fprintf(out, "  the pass that settles what a drain left unsettled (%.0f receipts, median): %.1f ms, %.1f µs a receipt\n",
		median(left), median(settleMs), 1000*median(settleMs)/median(left))
	fmt.Fprintf(out, "  a pass with nothing to check: %.2f ms (median of %d means of 20 passes)\n\n", median(idleMs), len(idleMs))

	fmt.Fprintf(out, "time from a loss (FLUSHALL after %d rows were published) to every row on the streams again:\n", cfg.Lost)
	for _, iv := range cfg.RepairIntervals {
		l, err := newAuditLane(ctx, cfg, rdb, cfg.Lost, iv)
		if err != nil {
			return err
		}
		res, err := l.run(ctx, rdb, func() error { return rdb.FlushAll(ctx).Err() })
		l.close()
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  audit every %-4s detected after %6.2f s, every row back after %6.2f s (republish %.2f s, %.0f rows/s)\n",
			iv, res.detect.Seconds(), res.repaired.Seconds(), (res.repaired - res.detect).Seconds(),
			float64(cfg.Lost)/(res.repaired-res.detect).Seconds())
	}
	return nil
}

type auditRun struct {
	rate             float64
	audits           float64
	detect, repaired time.Duration
}

// auditLane is one forwarder over a fresh schema and topic, seeded with n
// pending rows, not started.
type auditLane struct {
	pool     *pgxpool.Pool
	drop     func()
	f        *forwarder.Forwarder
	reg      *prometheus.Registry // f's metrics
	streams  []string
	n        int
	interval time.Duration
}

func newAuditLane(ctx context.Context, cfg AuditConfig, rdb *redis.Client, n int, interval time.Duration) (*auditLane, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 8)
	if err != nil {
		return nil, err
	}
	l := &auditLane{pool: pool, drop: drop, n: n, interval: interval}
	topic := "bench." + uuid.NewString()[:8]
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb, StreamPartitions: cfg.Streams})
	if err != nil {
		drop()
		return nil, err
	}
	l.streams = broker.Streams(topic)
	if err := seedOutbox(ctx, pool, topic, n, 0); err != nil {
		drop()
		return nil, err
	}
	l.reg = prometheus.NewRegistry()
	l.f, err = forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Registerer: l.reg, Logger: quietLogger(),
		AuditInterval: interval})
	if err != nil {
		drop()
		return nil, err
	}
	return l, nil
}

func (l *auditLane) close() { l.drop() }

// drain runs the forwarder until every row is on the streams, then stops
// it.
func (l *auditLane) drain(ctx context.Context, rdb *redis.Client) (auditRun, error) {
	return l.run(ctx, rdb, nil)
}

// passMs times audit passes by hand, the forwarder stopped (its loop would
// hold the audit's lock): the pass that settles what the drain left (a
// consumer group, created past the last entry, has acknowledged
// everything: each receipt is looked for, settled, the streams trimmed),
// and the mean of 20 passes with nothing left to check.
func (l *auditLane) passMs(ctx context.Context, rdb *redis.Client) (settle, idle float64, receipts int, err error) {
	if err := l.pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(positions)), 0) FROM outbox_receipts`).Scan(&receipts); err != nil {
		return 0, 0, 0, err
	}
	for _, s := range l.streams {
		if err := rdb.XGroupCreateMkStream(ctx, s, "bench-late", "$").Err(); err != nil {
			return 0, 0, 0, err
		}
	}
	t0 := time.Now()
	if err := l.f.Audit(ctx); err != nil {
		return 0, 0, 0, err
	}
	settle = float64(time.Since(t0).Microseconds()) / 1000
	const passes = 20
	t0 = time.Now()
	for range passes {
		if err := l.f.Audit(ctx); err != nil {
			return 0, 0, 0, err
		}
	}
	return settle, float64(time.Since(t0).Microseconds()) / 1000 / passes, receipts, nil
}

// run drains the lane; with lose, it then calls lose and measures the
// repair. No audit needs to have run before the loss.
func (l *auditLane) run(ctx context.Context, rdb *redis.Client, lose func() error) (auditRun, error) {
	var res auditRun
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- l.f.Run(rctx) }()
	stopRun := func() error {
		cancel()
		return <-done
	}
	// Every row acknowledged by the broker, as the forwarder counts them
	// (counted on the streams, the rows the audit trims once a consumer
	// has them would be missed; the outbox's cursors tell it a lease tick
	// late).
	if err := poll.Until(ctx, 5*time.Millisecond, 10*time.Minute, func() (bool, error) {
		n, err := forwarded(l.reg)
		return n >= float64(l.n), err
	}); err != nil {
		return res, errors.Join(err, stopRun())
	}
	elapsed := time.Since(start)
	res.rate = float64(l.n) / elapsed.Seconds()
	if l.interval > 0 {
		res.audits = float64(elapsed / l.interval) // passes during the drain
	}
	if lose == nil {
		return res, stopRun()
	}

	if err := lose(); err != nil {
		return res, errors.Join(err, stopRun())
	}
	lost := time.Now()
	if err := poll.Until(ctx, 5*time.Millisecond, 10*time.Minute, func() (bool, error) {
		var k int
		err := l.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_audit WHERE last_loss_at IS NOT NULL`).Scan(&k)
		if k > 0 && res.detect == 0 {
			res.detect = time.Since(lost)
		}
		if err != nil || k == 0 {
			return false, err
		}
		n, err := streamsLen(ctx, rdb, l.streams)
		return n >= int64(l.n), err
	}); err != nil {
		return res, errors.Join(err, stopRun())
	}
	res.repaired = time.Since(lost)
	return res, stopRun()
}

func streamsLen(ctx context.Context, rdb *redis.Client, streams []string) (int64, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(streams))
	for i, s := range streams {
		cmds[i] = pipe.XLen(ctx, s)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	var total int64
	for _, c := range cmds {
		total += c.Val()
	}
	return total, nil
}

// consume reads every stream as group "bench" and acknowledges what it
// reads, until ctx ends: a consumer that keeps up, so that the audit
// settles what the forwarder publishes, as in production.
func consume(ctx context.Context, rdb *redis.Client, streams []string) error {
	args := make([]string, 0, 2*len(streams))
	for _, s := range streams {
		if err := rdb.XGroupCreateMkStream(ctx, s, "bench", "0").Err(); err != nil && !isBusyGroup(err) {
			return err
		}
		args = append(args, s)
	}
	for range streams {
		args = append(args, ">")
	}
	for ctx.Err() == nil {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "bench", Consumer: "c", Streams: args, Count: 1000, Block: 100 * time.Millisecond}).Result()
		if errors.Is(err, redis.Nil) || ctx.Err() != nil {
			continue
		}
		if err != nil {
			return err
		}
		pipe := rdb.Pipeline()
		for _, st := range res {
			ids := make([]string, len(st.Messages))
			for i, m := range st.Messages {
				ids[i] = m.ID
			}
			pipe.XAck(ctx, st.Stream, "bench", ids...)
		}
		if _, err := pipe.Exec(ctx); err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

func isBusyGroup(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP") }

// startRedis runs a redis-server of the benchmark's own on a free port,
// without persistence: the loss run flushes it.
func startRedis(ctx context.Context) (*redis.Client, func(), error) {
	port, err := freeTCPPort()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "outflow-bench-redis")
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", dir+"/redis.log")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("start redis-server (install Redis): %w", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))})
	stop := func() {
		rdb.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	if err := poll.Until(ctx, 5*time.Millisecond, 10*time.Second, func() (bool, error) { return rdb.Ping(ctx).Err() == nil, nil }); err != nil {
		stop()
		return nil, nil, err
	}
	return rdb, stop, nil
}
