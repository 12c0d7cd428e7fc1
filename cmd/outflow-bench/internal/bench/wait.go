package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/poll"
)

// WaitConfig configures the WAIT benchmark.
type WaitConfig struct {
	// DatabaseURL is where fresh schemas are made. Required.
	DatabaseURL string
	// Backlog is the row count each drain moves. Defaults to 50,000.
	Backlog int
	// Rounds is how many drains of each mode run, alternating which goes
	// first. Defaults to 5.
	Rounds int
	Out    io.Writer
}

// WaitCommand parses outflow-bench wait's flags and runs [Wait].
func WaitCommand(ctx context.Context, dbURL string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	backlog := fs.Int("backlog", 50_000, "rows each drain moves")
	rounds := fs.Int("rounds", 5, "drains of each mode, alternating which goes first; medians are compared")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *backlog < 1 || *rounds < 1 {
		return errors.New("invalid -backlog or -rounds: must be positive")
	}
	return Wait(ctx, WaitConfig{DatabaseURL: dbURL, Backlog: *backlog, Rounds: *rounds, Out: out})
}

// Wait measures what WaitReplicas=1 costs the forwarder: the rows/s of a
// drain (claim, XADD, WAIT, mark; done when every row is marked) with WAIT
// 1 against without, to a primary and its replica of the benchmark's own
// on this machine, in the same run.
func Wait(ctx context.Context, cfg WaitConfig) error {
	if cfg.Backlog <= 0 {
		cfg.Backlog = 50_000
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 5
	}
	primary, stop, err := startRedisPair(ctx)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(cfg.Out, "WAIT cost: forwarder draining %d rows to a redis-server primary with one replica (local, no fsync), %d rounds each\n",
		cfg.Backlog, cfg.Rounds)
	rates := map[int][]float64{}
	for r := range cfg.Rounds {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, w := range order {
			rate, err := drainWith(ctx, cfg, primary, w)
			if err != nil {
				return fmt.Errorf("drain with WaitReplicas=%d: %w", w, err)
			}
			rates[w] = append(rates[w], rate)
		}
	}
	off, on := median(rates[0]), median(rates[1])
	// The ratio of each round's pair, back to back, is steadier than the
	// ratio of medians on a machine whose load moves.
	ratios := make([]float64, cfg.Rounds)
	for r := range ratios {
		ratios[r] = rates[1][r] / rates[0][r]
	}
	fmt.Fprintf(cfg.Out, "  WaitReplicas=0  %8.0f rows/s (median; rounds %s)\n", off, fmtRates(rates[0]))
	fmt.Fprintf(cfg.Out, "  WaitReplicas=1  %8.0f rows/s (median; rounds %s)\n", on, fmtRates(rates[1]))
	fmt.Fprintf(cfg.Out, "  WAIT 1 / no WAIT: median of the rounds' ratios %.2f (ratio of medians %.2f)\n", median(ratios), on/off)

	// The broker's side alone, without PostgreSQL: Publish of a forwarder
	// batch, the two modes interleaved batch by batch so that the machine's
	// load falls on both alike.
	lat, err := publishLatency(ctx, primary, 400, 500)
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "  Publish of a 500-entry batch, 400 each interleaved: p50 %.2f ms -> %.2f ms with WAIT 1, p99 %.2f ms -> %.2f ms\n\n",
		ms(pct(lat[0], 50)), ms(pct(lat[1], 50)), ms(pct(lat[0], 99)), ms(pct(lat[1], 99)))
	return nil
}

// publishLatency times n Publish calls of size entries in each mode
// (WaitReplicas 0 and 1), alternating.
func publishLatency(ctx context.Context, rdb *redis.Client, n, size int) (map[int][]time.Duration, error) {
	topic := "bench." + uuid.NewString()[:8]
	defer rdb.Del(context.WithoutCancel(ctx), topic)
	brokers := map[int]*redisstreams.Broker{}
	for _, w := range []int{0, 1} {
		b, err := redisstreams.New(redisstreams.Config{Client: rdb, WaitReplicas: w})
		if err != nil {
			return nil, err
		}
		brokers[w] = b
	}
	msgs := make([]forwarder.Outgoing, size)
	for i := range msgs {
		msgs[i] = forwarder.Outgoing{Topic: topic, AggregateID: strconv.Itoa(i),
			Message: message.NewMessage(uuid.NewString(), []byte(benchPayload))}
	}
	out := map[int][]time.Duration{}
	for i := range 2 * n {
		w := i % 2
		start := time.Now()
		for _, err := range brokers[w].Publish(ctx, msgs) {
			if err != nil {
				return nil, fmt.Errorf("publish with WaitReplicas=%d: %w", w, err)
			}
		}
		out[w] = append(out[w], time.Since(start))
		if i%100 == 99 {
			if err := rdb.XTrimMaxLen(ctx, topic, 0).Err(); err != nil { // keep the primary's memory flat
				return nil, err
			}
		}
	}
	return out, nil
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func drainWith(ctx context.Context, cfg WaitConfig, rdb *redis.Client, waitReplicas int) (float64, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 8)
	if err != nil {
		return 0, err
	}
	defer drop()
	topic := "bench." + uuid.NewString()[:8]
	defer rdb.Del(context.WithoutCancel(ctx), topic)
	if err := seedOutbox(ctx, pool, topic, cfg.Backlog, 0); err != nil {
		return 0, err
	}
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb, WaitReplicas: waitReplicas})
	if err != nil {
		return 0, err
	}
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Registerer: reg, Logger: quietLogger()})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	var n float64
	err = poll.Until(ctx, 20*time.Millisecond, 10*time.Minute, func() (bool, error) {
		var err error
		n, err = forwarded(reg)
		return int(n) >= cfg.Backlog, err
	})
	elapsed := time.Since(start)
	cancel()
	if errors.Is(err, poll.ErrTimeout) {
		err = fmt.Errorf("%d rows still pending after 10m", cfg.Backlog-int(n))
	}
	if err := errors.Join(err, <-done); err != nil {
		return 0, err
	}
	return float64(cfg.Backlog) / elapsed.Seconds(), nil
}

// startRedisPair starts a redis-server primary and a replica on free
// ports, in a temporary directory, and returns a client on the primary
// once the replica is in sync; stop kills both and removes the directory.
func startRedisPair(ctx context.Context) (*redis.Client, func(), error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, nil, errors.New("the wait benchmark starts its own redis-server processes and none is installed: " +
			"install Redis (Debian: apt-get install redis-server; macOS: brew install redis)")
	}
	dir, err := os.MkdirTemp("", "outflow-bench-wait-")
	if err != nil {
		return nil, nil, err
	}
	var (
		cmds    []*exec.Cmd
		clients []*redis.Client
	)
	stop := func() {
		for _, c := range clients {
			c.Close()
		}
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		os.RemoveAll(dir)
	}
	fail := func(err error) (*redis.Client, func(), error) {
		stop()
		return nil, nil, err
	}
	var primaryPort int
	for i := range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		d := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(d, 0o700); err != nil {
			return fail(err)
		}
		args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", d, "--logfile", filepath.Join(d, "redis.log"), "--repl-diskless-sync-delay", "0"}
		if i == 0 {
			primaryPort = port
		} else {
			args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(primaryPort))
		}
		cmd := exec.Command("redis-server", args...)
		if err := cmd.Start(); err != nil {
			return fail(fmt.Errorf("start redis-server: %w", err))
		}
		cmds = append(cmds, cmd)
		clients = append(clients, redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)}))
	}
	if err := poll.Until(ctx, 20*time.Millisecond, 20*time.Second, func() (bool, error) {
		p, err1 := clients[0].Info(ctx, "replication").Result()
		r, err2 := clients[1].Info(ctx, "replication").Result()
		return err1 == nil && err2 == nil && strings.Contains(p, "connected_slaves:1") && strings.Contains(r, "master_link_status:up"), nil
	}); err != nil {
		return fail(fmt.Errorf("the benchmark's redis replica did not get in sync (logs in %s): %w", dir, err))
	}
	return clients[0], stop, nil
}

func fmtRates(xs []float64) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += " "
		}
		out += strconv.FormatFloat(x, 'f', 0, 64)
	}
	return out
}
