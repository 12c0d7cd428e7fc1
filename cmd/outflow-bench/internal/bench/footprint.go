package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/poll"
)

// FootprintConfig configures [Footprint].
type FootprintConfig struct {
	// DatabaseURL is the server the throwaway database is created on.
	DatabaseURL string
	// RedisURL is the broker both services connect to.
	RedisURL string
	// Runs is how many times each service is started. Defaults to 10.
	Runs int
	Out  io.Writer
}

// footprintService is one binary measured: how to build it, start it, and
// know that it is ready.
type footprintService struct {
	name    string
	pkg     string
	args    func(addr string) []string
	env     func(addr string) []string
	migrate []string
	ready   string // path answered with 200 once it serves
}

// Footprint builds the outflow binary and the example payouts service and
// compares their size and their start-up time: from exec until the HTTP API
// answers, each process running its API, a forwarder and a worker against
// an already migrated database (the outflow binary never migrates at start;
// the payouts service does unless told not to, so it is measured both ways).
// The outflow binary is the baseline.
func Footprint(ctx context.Context, cfg FootprintConfig) error {
	if cfg.Runs <= 0 {
		cfg.Runs = 10
	}
	dir, err := os.MkdirTemp("", "outflow-footprint-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dbURL, drop, err := throwawayDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer drop()

	services := []footprintService{
		{
			name: "outflow (reference payments, every broker)", pkg: "./cmd/outflow",
			args:    func(string) []string { return []string{"serve", "--roles", "api,forwarder,worker"} },
			env:     func(addr string) []string { return []string{"HTTP_ADDR=" + addr} },
			migrate: []string{"migrate"},
			ready:   "/healthz",
		},
		{
			name: "examples/payouts (Redis only)", pkg: "./examples/payouts/cmd/payouts",
			args:    func(addr string) []string { return []string{"-addr", addr, "-migrate=false"} },
			env:     func(string) []string { return nil },
			migrate: []string{"-migrate-only"},
			ready:   "/merchants/none/balances",
		},
		{
			name: "examples/payouts, migrating at start", pkg: "./examples/payouts/cmd/payouts",
			args:    func(addr string) []string { return []string{"-addr", addr} },
			env:     func(string) []string { return nil },
			migrate: []string{"-migrate-only"},
			ready:   "/merchants/none/balances",
		},
	}
	out := cfg.Out
	fmt.Fprintf(out, "footprint: build size and start-up (exec until the HTTP API answers), %d starts each\n", cfg.Runs)
	var base [2]float64
	for i, s := range services {
		bin := filepath.Join(dir, fmt.Sprint(i))
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, s.pkg)
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build %s: %w", s.pkg, err)
		}
		st, err := os.Stat(bin)
		if err != nil {
			return err
		}
		env := append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+cfg.RedisURL, "LOG_LEVEL=error")
		mig := exec.CommandContext(ctx, bin, s.migrate...)
		mig.Env = env
		if b, err := mig.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %w\n%s", s.pkg, strings.Join(s.migrate, " "), err, b)
		}
		var took []time.Duration
		var rss []int
		for range cfg.Runs {
			d, kb, err := startOnce(ctx, bin, s, env)
			if err != nil {
				return fmt.Errorf("%s: %w", s.pkg, err)
			}
			took, rss = append(took, d), append(rss, kb)
		}
		slices.Sort(took)
		slices.Sort(rss)
		med := took[len(took)/2]
		size := float64(st.Size()) / (1 << 20)
		if i == 0 {
			base = [2]float64{size, med.Seconds()}
		}
		fmt.Fprintf(out, "  %-44s %6.1f MiB (%.2fx)  start-up median %6.1f ms (min %.1f, max %.1f; %.2fx)  RSS when ready %d MiB\n",
			s.name, size, size/base[0], ms(med), ms(took[0]), ms(took[len(took)-1]), med.Seconds()/base[1], rss[len(rss)/2]/1024)
	}
	return nil
}

// startOnce starts bin, waits until s.ready answers 200, reads its resident
// set, and stops it with SIGTERM.
func startOnce(ctx context.Context, bin string, s footprintService, env []string) (time.Duration, int, error) {
	addr, err := freeAddr()
	if err != nil {
		return 0, 0, err
	}
	cmd := exec.CommandContext(ctx, bin, s.args(addr)...)
	cmd.Env = append(slices.Clone(env), s.env(addr)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	client := &http.Client{Timeout: time.Second}
	var last error
	if poll.Until(ctx, time.Millisecond, 30*time.Second, func() (bool, error) {
		resp, err := client.Get("http://" + addr + s.ready)
		if last = err; err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}) != nil {
		return 0, 0, fmt.Errorf("not serving %s after 30s (last error: %v); its stderr:\n%s", s.ready, last, stderr.String())
	}
	took := time.Since(start)
	return took, residentKB(cmd.Process.Pid), nil
}

func residentKB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return kb
		}
	}
	return 0
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// throwawayDatabase creates a database of its own next to dbURL's and
// returns its URL and a function that drops it.
func throwawayDatabase(ctx context.Context, dbURL string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to PostgreSQL (run `make services-up`): %w", err)
	}
	name := fmt.Sprintf("outflow_footprint_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "DROP DATABASE "+name+" WITH (FORCE)")
		conn.Close(context.WithoutCancel(ctx))
	}, nil
}
