package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// 00026 only sets consumer_aggregate_versions' fillfactor and comments on
// processed_messages: it runs while a consumer's transaction (of this
// release or the one before) is open on both tables, waits for nothing,
// and keeps every row; its down resets both.
func TestConsumerVersionsOnlyUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	db := s.OpenDB(t)
	fillfactor := func() (opts []string) {
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class
			WHERE oid = 'consumer_aggregate_versions'::regclass`).Scan(&opts))
		return opts
	}
	require.Equal(t, []string{"fillfactor=70"}, fillfactor())
	downTo(t, db, 26)
	require.Empty(t, fillfactor())
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
		SELECT 'c', 'a', i::text, i FROM generate_series(1, 100) i;
		INSERT INTO processed_messages (message_id, consumer) SELECT gen_random_uuid(), 'c' FROM generate_series(1, 100)`)
	require.NoError(t, err)

	// A consumer of the release before, mid-transaction: its version row
	// locked, a processed row written.
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version) VALUES ('c', 'a', '1', 2)
		ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET version = excluded.version, updated_at = now()`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO processed_messages (message_id, consumer) VALUES (gen_random_uuid(), 'c')`)
	require.NoError(t, err)

	upCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rs, err := migrations.Up(upCtx, db)
	require.NoError(t, err, "the migration waits for no consumer's transaction")
	require.NotEmpty(t, rs)
	require.EqualValues(t, 26, rs[0].Version, "then the later ones rolled back with it")
	require.Equal(t, []string{"fillfactor=70"}, fillfactor())
	var comment *string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT obj_description('processed_messages'::regclass, 'pg_class')`).Scan(&comment))
	require.NotNil(t, comment)
	require.Contains(t, *comment, "Not written")

	// The consumer's transaction goes on and commits: every row kept.
	_, err = tx.Exec(ctx, `UPDATE consumer_aggregate_versions SET version = 3 WHERE aggregate_id = '2'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var versions, processed int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM consumer_aggregate_versions`).Scan(&versions))
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&processed))
	require.Equal(t, 100, versions)
	require.Equal(t, 101, processed)

	downTo(t, db, 26)
	require.Empty(t, fillfactor())
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT obj_description('processed_messages'::regclass, 'pg_class')`).Scan(&comment))
	require.Nil(t, comment)
}
