package migrations_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// 00022 replaces 00017's index of an aggregate's published rows by one in
// version order; its down puts the old one back.
func TestAggregateVersionIndexReplacesAggregateIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	db := s.OpenDB(t)
	def := func(index string) string {
		var d *string
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT pg_get_indexdef(to_regclass($1))`, index).Scan(&d))
		if d == nil {
			return ""
		}
		return *d
	}
	// Every row since 00025 (published is no row state any more).
	require.True(t, strings.HasSuffix(def("outbox_aggregate_version_idx"),
		"USING btree (aggregate_type, aggregate_id, aggregate_version, id)"), def("outbox_aggregate_version_idx"))
	require.Empty(t, def("outbox_aggregate_idx"))

	downTo(t, db, 25)
	require.Contains(t, def("outbox_aggregate_version_idx"),
		"USING btree (aggregate_type, aggregate_id, aggregate_version, id) WHERE (published_at IS NOT NULL)")

	downTo(t, db, 22)
	require.Empty(t, def("outbox_aggregate_version_idx"))
	require.Contains(t, def("outbox_aggregate_idx"), "USING btree (aggregate_type, aggregate_id) WHERE (published_at IS NOT NULL)")

	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.NotEmpty(t, def("outbox_aggregate_version_idx"))
	require.Empty(t, def("outbox_aggregate_idx"))
}

// downTo rolls the framework's set back, one version at a time, until
// version has been rolled back: the later versions go first.
func downTo(t *testing.T, db *sql.DB, version int64) {
	t.Helper()
	for {
		r, err := migrations.Down(context.Background(), db)
		require.NoError(t, err)
		require.GreaterOrEqual(t, r.Version, version, "version %d is not applied", version)
		if r.Version == version {
			return
		}
	}
}
