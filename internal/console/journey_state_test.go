package console_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The journey's pages give each row the state, published and published_by
// the view outbox_state gives it, in each case of the view's rule (the
// journey writes the rule out), read in both directions.
func TestJourneyStateIsOutboxState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, outflowtest.SeedOutboxStates(ctx, e.pool))
	type state struct {
		State     string
		Published bool
		By        *time.Time
		ParkedAt  *time.Time
	}
	rows, err := e.pool.Query(ctx, `SELECT id, state, published, published_by, parked_at FROM outbox_state`)
	require.NoError(t, err)
	want := map[int64]state{}
	var (
		id int64
		st state
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &st.State, &st.Published, &st.By, &st.ParkedAt}, func() error {
		want[id] = st
		return nil
	})
	require.NoError(t, err)
	got := map[int64]state{}
	for i := range 10 {
		for name, from := range map[string][]any{"events after": {0, 0}, "events before": {1 << 40, 1 << 40}} {
			rows, err := e.pool.Query(ctx, console.Queries[name], append([]any{"a", fmt.Sprint("a", i)}, append(from, 100)...)...)
			require.NoError(t, err)
			for rows.Next() {
				v, err := rows.Values()
				require.NoError(t, err)
				var s state
				s.State, s.Published = v[10].(string), v[11].(bool)
				if t, ok := v[12].(time.Time); ok {
					s.By = &t
				}
				if t, ok := v[13].(time.Time); ok {
					s.ParkedAt = &t
				}
				got[v[0].(int64)] = s
			}
			require.NoError(t, rows.Err())
		}
	}
	require.Len(t, got, len(want))
	for id, w := range want {
		g := got[id]
		require.Equal(t, w.State, g.State, "row %d", id)
		require.Equal(t, w.Published, g.Published, "row %d", id)
		require.Equal(t, w.By == nil, g.By == nil, "row %d", id)
		if w.By != nil {
			require.True(t, w.By.Equal(*g.By), "row %d", id)
		}
		require.Equal(t, w.ParkedAt == nil, g.ParkedAt == nil, "row %d", id)
	}
}
