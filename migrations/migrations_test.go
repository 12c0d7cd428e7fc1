package migrations_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// frameworkTables is everything the framework's set creates, and nothing
// of the reference app's.
var frameworkTables = []string{
	"consumer_aggregate_versions", "dead_letters", "outbox", "outbox_audit", "outbox_default", "outbox_failures",
	"outbox_forwarders", "outbox_p0", "outbox_p10000000", "outbox_partition_sets", "outbox_partitions", "outbox_receipts",
	"outbox_state", "outbox_wal_audit", "outbox_wal_history", "outbox_wal_parked", "outbox_wal_receipts", "outbox_wal_slots",
	"outflow_claim_bodies", "outflow_claim_bodies_default", migrations.VersionTable, "outflow_operator_actions", "processed_messages",
}

// claimDay names a day partition of outflow_claim_bodies.
var claimDay = regexp.MustCompile(`^outflow_claim_bodies_\d{8}$`)

func tables(t *testing.T, s *outflowtest.Schema, schema string) []string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(),
		`SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, schema)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		if claimDay.MatchString(n) {
			continue // migration 00033 creates today's and the next days': named by date
		}
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
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
	all := tables(t, s, s.Name)
	require.Equal(t, frameworkTables, all, "the framework's set creates its own tables only")

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
	require.Equal(t, []string{migrations.VersionTable}, tables(t, s, s.Name))

	rs2, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, rs2, len(rs))
	require.Equal(t, all, tables(t, s, s.Name))

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

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := outflowtest.NewEmptySchema(t).OpenDB(t)
	fw := migrations.Framework()
	tests := []struct {
		name string
		set  migrations.Set
		cfg  migrations.Config
		want string
	}{
		{"framework", fw, migrations.Config{Schema: "outflow"}, ""},
		{"no name", migrations.Set{FS: fw.FS, VersionTable: "v"}, migrations.Config{}, "Name is required"},
		{"no fs", migrations.Set{Name: "x", VersionTable: "v"}, migrations.Config{}, "FS is required"},
		{"qualified table", migrations.Set{Name: "x", FS: fw.FS, VersionTable: "s.v"}, migrations.Config{}, "unqualified"},
		{"upper-case table", migrations.Set{Name: "x", FS: fw.FS, VersionTable: "V"}, migrations.Config{}, "lower-case"},
		{"adopt from itself", migrations.Set{Name: "x", FS: fw.FS, VersionTable: "v", AdoptFrom: "v"}, migrations.Config{}, "must differ"},
		{"long schema", fw, migrations.Config{Schema: strings.Repeat("s", 64)}, "at most 63 bytes"},
		{"upper-case schema", fw, migrations.Config{Schema: "Outflow"}, "lower-case"},
		{"quoted schema", fw, migrations.Config{Schema: `a"b`}, "lower-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := migrations.NewMigrator(db, tt.set, tt.cfg)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := migrations.NewMigrator(nil, fw, migrations.Config{})
	require.ErrorContains(t, err, "db is required")
}

// A search_path whose schemas do not exist leaves nowhere to migrate.
func TestNoSchema(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	db := s.OpenDB(t)
	db.SetMaxOpenConns(1)
	_, err := db.ExecContext(context.Background(), `SET search_path TO no_such_schema_here`)
	require.NoError(t, err)
	_, err = migrations.Up(context.Background(), db)
	require.ErrorIs(t, err, migrations.ErrNoSchema)
}

func TestStatusListsFrameworkVersionsOnly(t *testing.T) {
	t.Parallel()
	st, err := migrations.CurrentStatus(context.Background(), outflowtest.NewEmptySchema(t).OpenDB(t))
	require.NoError(t, err)
	var versions []int64
	for _, s := range st {
		versions = append(versions, s.Version)
		require.False(t, s.Applied)
	}
	// The numbers they had when the app's migrations were in the same set,
	// which is what lets a database of that release adopt them.
	require.True(t, slices.Equal([]int64{1, 4, 5, 8, 10, 11}, versions[:6]), "%v", versions)
	require.Contains(t, versions, int64(16), "the broker-loss audit's tables")
}
