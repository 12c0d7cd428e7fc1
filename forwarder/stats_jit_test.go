package forwarder_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// ReadStats runs without JIT compilation. Its plan's cost estimate follows
// the outbox's size, not what is pending (outbox_partition_sets is too
// small for autovacuum to ever analyze it, so the planner assumes 1,570
// partition sets): at a million rows it passes jit_above_cost, and
// compiling the plan took 0.5 to 1.8 s of a read that takes 2 ms (the
// console's overview read it past its 700 ms ReadTimeout, every refresh).
// Here every plan would be JIT-compiled (the session's thresholds at 0):
// the statements ReadStats sends, recorded as it sends them, are run
// again in one transaction, each read under EXPLAIN ANALYZE, whose plan
// names any JIT compilation.
func TestReadStatsWithoutJIT(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(s.URL)
	require.NoError(t, err)
	for k, v := range map[string]string{"jit": "on", "jit_above_cost": "0", "jit_inline_above_cost": "0", "jit_optimize_above_cost": "0"} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	rec := &batchRecorder{}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var jitAvailable bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&jitAvailable))
	require.True(t, jitAvailable, "this PostgreSQL has no JIT (Debian: postgresql-15's llvmjit): the test would show nothing")

	_, err = forwarder.ReadStats(ctx, pool)
	require.NoError(t, err)
	require.NotEmpty(t, rec.queries, "ReadStats sends its reads in a batch")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	explained := 0
	for _, q := range rec.queries {
		if !strings.HasPrefix(strings.TrimSpace(q.SQL), "SELECT") && !strings.HasPrefix(strings.TrimSpace(q.SQL), "WITH") {
			_, err := tx.Exec(ctx, q.SQL, q.Arguments...)
			require.NoError(t, err, q.SQL)
			continue
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE) "+q.SQL, q.Arguments...)
		require.NoError(t, err, q.SQL)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, q.SQL)
		plan := strings.Join(lines, "\n")
		require.NotContains(t, plan, "JIT:", "a read of ReadStats compiles its plan:\n%s", plan)
		explained++
	}
	require.Positive(t, explained)
}

// batchRecorder records the statements of the batches a pool sends.
type batchRecorder struct {
	mu      sync.Mutex
	queries []*pgx.QueuedQuery
}

func (r *batchRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (r *batchRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *batchRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries = append(r.queries, d.Batch.QueuedQueries...)
	return ctx
}
func (r *batchRecorder) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *batchRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
