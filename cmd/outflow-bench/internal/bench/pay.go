// Package bench holds Outflow's benchmarks that need more than `go test
// -bench` gives: several concurrency levels, a baseline measured in the same
// run, and percentiles. `make bench` runs them through cmd/outflow-bench.
package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
)

// PayConfig configures the pay benchmark.
type PayConfig struct {
	// Pool is a migrated schema of its own. Required.
	Pool *pgxpool.Pool
	// Clients lists the concurrency levels. Defaults to 1, 4, 16, 64.
	Clients []int
	// Ops is how many pay commands each variant runs at each concurrency
	// level. Defaults to 6000.
	Ops int
	// Slices splits each cell's ops into slices that alternate between the
	// variants. Defaults to 20.
	Slices int
	Out    io.Writer
}

// noPublish is the baseline: the same command without the outbox write.
type noPublish struct{}

func (noPublish) QueueTx(context.Context, pgx.Tx, *pgx.Batch, ...events.Event) error { return nil }

type sample struct {
	latencies []time.Duration
	elapsed   time.Duration
}

// Pay measures the latency and throughput of the pay command's transaction
// with the outbox publish against the same transaction without it.
func Pay(ctx context.Context, cfg PayConfig) error {
	if len(cfg.Clients) == 0 {
		cfg.Clients = []int{1, 4, 16, 64}
	}
	if cfg.Ops <= 0 {
		cfg.Ops = 6000
	}
	if cfg.Slices <= 0 {
		cfg.Slices = 20
	}
	writer, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	if err != nil {
		return err
	}
	with, err := app.NewService(app.Config{Pool: cfg.Pool, Events: writer})
	if err != nil {
		return err
	}
	without, err := app.NewService(app.Config{Pool: cfg.Pool, Events: noPublish{}})
	if err != nil {
		return err
	}
	m, err := with.CreateMerchant(ctx, app.NewMerchant{Name: "Bench", WebhookURL: "https://bench.example/h"})
	if err != nil {
		return err
	}

	variants := []struct {
		name string
		svc  *app.Service
	}{{"without outbox", without}, {"with outbox", with}}
	results := make(map[string]map[int][]sample)
	for _, v := range variants {
		results[v.name] = make(map[int][]sample)
	}
	// The variants alternate in short slices (ABBA...), so that checkpoints,
	// autovacuum and whatever else the 2-core machine does fall on both
	// alike: the ratio is what this benchmark is for.
	slice := max(cfg.Ops/cfg.Slices, 1)
	fmt.Fprintf(cfg.Out, "pay benchmark: %d ops per variant and concurrency, in slices of %d alternating, clients %v\n",
		cfg.Ops, slice, cfg.Clients)
	settle(ctx, cfg.Pool)
	for _, c := range cfg.Clients {
		for i := range cfg.Slices {
			order := []int{0, 1}
			if i%2 == 1 {
				order = []int{1, 0}
			}
			for _, vi := range order {
				v := variants[vi]
				ids, err := pendingPayments(ctx, cfg.Pool, m.ID, slice)
				if err != nil {
					return err
				}
				s, err := runPay(ctx, v.svc, ids, c)
				if err != nil {
					return fmt.Errorf("%s, %d clients: %w", v.name, c, err)
				}
				results[v.name][c] = append(results[v.name][c], s)
			}
		}
	}

	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(cfg.Out)
	fmt.Fprintln(tw, "clients\tvariant\ttx/s\tp50 ms\tp99 ms\t")
	for _, c := range cfg.Clients {
		var stats [2]stat
		for i, v := range variants {
			stats[i] = summarize(results[v.name][c])
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.3f\t%.3f\t\n", c, v.name, stats[i].tps, ms(stats[i].p50), ms(stats[i].p99))
		}
		fmt.Fprintf(tw, "%d\twith / without\t%.2fx\t%.2fx\t%.2fx\t\n", c,
			stats[1].tps/stats[0].tps, ms(stats[1].p50)/ms(stats[0].p50), ms(stats[1].p99)/ms(stats[0].p99))
	}
	return tw.Flush()
}

type stat struct {
	tps      float64
	p50, p99 time.Duration
}

// summarize pools the latencies and the elapsed time of every slice.
func summarize(ss []sample) stat {
	var (
		all     []time.Duration
		elapsed time.Duration
	)
	for _, s := range ss {
		all = append(all, s.latencies...)
		elapsed += s.elapsed
	}
	slices.Sort(all)
	return stat{tps: float64(len(all)) / elapsed.Seconds(), p50: quantile(all, 0.50), p99: quantile(all, 0.99)}
}

// quantile is the q-quantile of sorted by nearest rank, the ceil(q·n)-th
// value; the zero value when sorted is empty. Every latency table of the
// benchmarks takes its quantiles here, so their p99s mean the same.
func quantile[T any](sorted []T, q float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	return sorted[min(max(int(math.Ceil(q*float64(len(sorted))))-1, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func runPay(ctx context.Context, svc *app.Service, ids []string, clients int) (sample, error) {
	return runClients(ids, clients, func(id string) error {
		_, err := svc.Pay(ctx, id)
		return err
	})
}

// runClients hands ids to clients concurrent callers of call and times
// each call: the latencies and the whole run's time, and the first error.
func runClients(ids []string, clients int, call func(id string) error) (sample, error) {
	var (
		mu      sync.Mutex
		lat     = make([]time.Duration, 0, len(ids))
		next    = make(chan string)
		firstEr error
		wg      sync.WaitGroup
	)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			local := make([]time.Duration, 0, len(ids)/clients+1)
			for id := range next {
				t0 := time.Now()
				err := call(id)
				local = append(local, time.Since(t0))
				if err != nil {
					mu.Lock()
					if firstEr == nil {
						firstEr = err
					}
					mu.Unlock()
				}
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return sample{latencies: lat, elapsed: time.Since(start)}, firstEr
}

// pendingPayments inserts n pending payments in bulk, outside the measured
// part.
func pendingPayments(ctx context.Context, pool *pgxpool.Pool, merchantID string, n int) ([]string, error) {
	rows, err := pool.Query(ctx, `
		INSERT INTO payments (id, merchant_id, amount, currency, status, version, created_at, updated_at)
		SELECT gen_random_uuid(), $1, 1000 + g, 'EUR', 'pending', 1, now(), now() FROM generate_series(1, $2) g
		RETURNING id::text`, merchantID, n)
	if err != nil {
		return nil, fmt.Errorf("seed payments: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// settle starts from a checkpoint, so the run does not inherit the previous
// one's dirty pages. It needs superuser; without it the run is only noisier.
func settle(ctx context.Context, pool *pgxpool.Pool) {
	_, _ = pool.Exec(ctx, `CHECKPOINT`)
}
