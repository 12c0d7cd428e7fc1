package actionlog

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
)

// The journey's replays and the Actions page's list of actions read
// through their indexes, stopped by their limits: no scan of the table,
// no sort of an aggregate's records.
func TestQueriesUseTheirIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	conn, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	for _, tc := range []struct {
		name, q, index string
		args           []any
	}{
		{"on aggregate", qOnAggregate, "outflow_operator_actions_aggregate_idx", []any{"payment", "p1", "replay", 11}},
		{"actions", qActions, "outflow_operator_actions_action_idx", nil},
	} {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			_, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode)
			require.NoError(t, err)
			rows, err := conn.Query(ctx, "EXPLAIN "+tc.q, tc.args...)
			require.NoError(t, err, tc.name)
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err, tc.name)
			text := strings.Join(plan, "\n")
			require.Contains(t, text, tc.index, "%s (%s):\n%s", tc.name, mode, text)
			require.NotContains(t, text, "Seq Scan", "%s (%s):\n%s", tc.name, mode, text)
			require.NotContains(t, text, "Sort", "%s (%s):\n%s", tc.name, mode, text)
		}
	}
}
