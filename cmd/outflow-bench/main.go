// Command outflow-bench runs Outflow's benchmarks, each against a baseline
// measured in the same run, in a schema of its own that it drops at the end.
//
//	outflow-bench pay [-ops 6000] [-slices 20] [-clients 1,4,16]
//
// The database is BENCH_DATABASE_URL, defaulting to the test database.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/outflow-dev/outflow/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "outflow-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: outflow-bench pay [flags]")
	}
	dbURL := os.Getenv("BENCH_DATABASE_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:5432/outflow_test?sslmode=disable"
	}
	switch args[0] {
	case "pay":
		fs := flag.NewFlagSet("pay", flag.ContinueOnError)
		ops := fs.Int("ops", 6000, "pay commands per variant and concurrency level")
		slices := fs.Int("slices", 20, "alternating slices the ops are split into")
		clients := fs.String("clients", "1,4,16", "comma-separated concurrency levels")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		levels, err := parseInts(*clients)
		if err != nil {
			return fmt.Errorf("invalid -clients: %w", err)
		}
		pool, drop, err := bench.Schema(ctx, dbURL, int32(maxOf(levels)+2))
		if err != nil {
			return err
		}
		defer drop()
		return bench.Pay(ctx, bench.PayConfig{Pool: pool, Clients: levels, Ops: *ops, Slices: *slices, Out: os.Stdout})
	default:
		return fmt.Errorf("unknown benchmark %q (known: pay)", args[0])
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func maxOf(xs []int) int {
	m := xs[0]
	for _, x := range xs[1:] {
		m = max(m, x)
	}
	return m
}
