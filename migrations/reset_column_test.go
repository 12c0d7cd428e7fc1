package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// 00023 adds consumer_aggregate_versions.reset_at, nullable: existing rows
// read NULL (never reset); its down drops it, and up adds it again.
func TestConsumerAggregateResetColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	db := s.OpenDB(t)
	column := func() (exists bool) {
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = 'consumer_aggregate_versions' AND column_name = 'reset_at')`).Scan(&exists))
		return exists
	}
	require.True(t, column())
	downTo(t, db, 23)
	require.False(t, column())
	_, err := s.Pool.Exec(ctx, `INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version) VALUES ('c', 'a', 'x', 3)`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	require.True(t, column())
	var reset *string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT reset_at::text FROM consumer_aggregate_versions WHERE aggregate_id = 'x'`).Scan(&reset))
	require.Nil(t, reset, "a row written before the migration was never reset")
}
