package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

func tables(t *testing.T, s *outflowtest.Schema) []string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(),
		`SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, s.Name)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	return out
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	db := s.OpenDB(t)
	ctx := context.Background()

	rs, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.NotEmpty(t, rs)
	all := tables(t, s)
	require.Contains(t, all, "outbox")
	require.Contains(t, all, "payments")

	again, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Empty(t, again, "a second up is a no-op")

	// Down one step at a time until nothing is left, then up again.
	for range rs {
		r, err := migrations.Down(ctx, db)
		require.NoError(t, err)
		require.NotNil(t, r)
		require.False(t, r.Up)
	}
	r, err := migrations.Down(ctx, db)
	require.NoError(t, err)
	require.Nil(t, r, "nothing left to roll back")
	require.Equal(t, []string{migrations.VersionTable}, tables(t, s))

	rs2, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, rs2, len(rs))
	require.Equal(t, all, tables(t, s))

	st, err := migrations.CurrentStatus(ctx, db)
	require.NoError(t, err)
	require.Len(t, st, len(rs))
	for _, m := range st {
		require.True(t, m.Applied, "%d %s", m.Version, m.Name)
	}
}

// Processes starting together all run Up; the advisory lock makes one apply
// each migration and the others find it applied.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	ctx := context.Background()
	const procs = 4
	applied := make([][]migrations.Result, procs)
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		db := s.OpenLibPQ(t) // a connection pool of its own, like a separate process
		wg.Go(func() { applied[i], errs[i] = migrations.Up(ctx, db) })
	}
	wg.Wait()
	total := 0
	for i := range procs {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	st, err := migrations.CurrentStatus(ctx, s.OpenDB(t))
	require.NoError(t, err)
	require.Equal(t, len(st), total, "each migration applied exactly once across processes")

	var versions int
	require.NoError(t, s.Pool.QueryRow(ctx,
		`SELECT count(*) FROM `+migrations.VersionTable+` WHERE version_id > 0`).Scan(&versions))
	require.Equal(t, len(st), versions)
}
