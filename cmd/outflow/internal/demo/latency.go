package demo

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// requestTimes collects the client-side duration of every API command the
// load sends: what a caller of the API waits, network and retries included.
type requestTimes struct {
	mu sync.Mutex
	d  []time.Duration
}

func (r *requestTimes) add(d time.Duration) {
	r.mu.Lock()
	r.d = append(r.d, d)
	r.mu.Unlock()
}

// percentiles returns the nearest-rank percentiles qs (0..1) and the max.
func (r *requestTimes) percentiles(qs ...float64) (ps []time.Duration, maxd time.Duration, n int) {
	r.mu.Lock()
	d := slices.Clone(r.d)
	r.mu.Unlock()
	if len(d) == 0 {
		return make([]time.Duration, len(qs)), 0, 0
	}
	slices.Sort(d)
	for _, q := range qs {
		i := int(q*float64(len(d))+0.5) - 1
		ps = append(ps, d[min(max(i, 0), len(d)-1)])
	}
	return ps, d[len(d)-1], len(d)
}

// pipelineLatencies measures each stage from the outbox row's created_at
// (the command's transaction start) to the moment the row reached it, on
// the database's clock at both ends, so no clock skew enters. No row
// records when it was published: the first stage ends at its published_by
// (outbox_state), when its partition's cursor moved past it, recorded at
// the forwarder's lease tick: an upper bound, up to a lease tick late.
// A consumer keeps no row per message, only its aggregate's version and
// when that row was last written (updated_at): sync-analytics is measured
// on each aggregate's latest event, the one its version row stands at. A
// redelivery of that event writes the row again, so a duplicate can only
// lengthen the figure, never flatter it.
const pipelineLatencies = `
	WITH run AS (SELECT o.message_id, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.created_at, s.published_by
	             FROM outbox o JOIN outbox_state s USING (id) WHERE o.created_at >= $1),
	stage AS (
		SELECT 'outbox row -> published (at most)' AS name, 1 AS ord,
		       extract(epoch FROM published_by - created_at) * 1000 AS ms
		FROM run WHERE published_by IS NOT NULL
		UNION ALL
		SELECT 'outbox row -> sync-analytics applied', 2,
		       extract(epoch FROM v.updated_at - run.created_at) * 1000
		FROM run JOIN consumer_aggregate_versions v ON v.consumer = 'sync-analytics'
		     AND v.aggregate_type = run.aggregate_type AND v.aggregate_id = run.aggregate_id
		     AND v.version = run.aggregate_version
		UNION ALL
		SELECT 'outbox row -> webhook delivered', 3,
		       extract(epoch FROM w.settled_at - run.created_at) * 1000
		FROM run JOIN webhook_endpoint_deliveries w ON w.message_id = run.message_id AND w.status = 'delivered')
	SELECT name, count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms)::float8[], max(ms)::float8
	FROM stage GROUP BY name, ord ORDER BY ord`

// reportLatency prints the percentiles of the API's commands, measured by
// the client, and of each pipeline stage, measured by the database.
func reportLatency(ctx context.Context, cfg Config, since time.Time, rt *requestTimes) error {
	out := cfg.Out
	fmt.Fprintf(out, "\nlatency\n  %-37s %9s %9s %9s %9s %8s\n", "", "p50", "p95", "p99", "max", "samples")
	ps, maxd, n := rt.percentiles(0.5, 0.95, 0.99)
	printLatency(out, "API command (client-side)", ms(ps[0]), ms(ps[1]), ms(ps[2]), ms(maxd), n)
	rows, err := cfg.Pool.Query(ctx, pipelineLatencies, since)
	if err != nil {
		return fmt.Errorf("read pipeline latencies: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name  string
			n     int
			p     []float64
			maxMs float64
		)
		if err := rows.Scan(&name, &n, &p, &maxMs); err != nil {
			return fmt.Errorf("read pipeline latencies: %w", err)
		}
		printLatency(out, name, p[0], p[1], p[2], maxMs, n)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read pipeline latencies: %w", err)
	}
	fmt.Fprintln(out, "  (stages from the outbox row's created_at, the command's transaction start, on the database clock;")
	fmt.Fprintln(out, "   published: when the row's partition cursor passed it, recorded at the forwarder's lease tick, an upper bound)")
	return nil
}

func printLatency(out io.Writer, name string, p50, p95, p99, maxMs float64, n int) {
	fmt.Fprintf(out, "  %-37s %9s %9s %9s %9s %8d\n", name, fmtMs(p50), fmtMs(p95), fmtMs(p99), fmtMs(maxMs), n)
}

// fmtMs prints milliseconds to three significant figures, in seconds from
// one second up: a chaos run's tail is seconds, a quiet run's milliseconds.
func fmtMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.1f ms", v)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
