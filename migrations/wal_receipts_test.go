package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// 00030 on a WAL-mode database with history and parked events: every row
// stays, the rows written before have no id (they are not audited), rows
// written after take one from the sequence, the index holds only those,
// and a parked event keeps its place. Its down removes what it added and
// keeps the rows.
func TestWALReceiptsUpgradeKeepsTheHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	db := s.OpenDB(t)
	downTo(t, db, 30)
	insert := func(n int) {
		t.Helper()
		_, err := s.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS outbox_wal_history_20261204 PARTITION OF outbox_wal_history
			FOR VALUES FROM ('2026-12-04') TO ('2026-12-05')`)
		require.NoError(t, err)
		_, err = s.Pool.Exec(ctx, `
			INSERT INTO outbox_wal_history (recorded_at, commit_lsn, position, message_id, topic, aggregate_type, aggregate_id,
			    aggregate_version, event_type, payload, occurred_at)
			SELECT '2026-12-04 12:00+00', '0/16B3748', g, gen_random_uuid(), 'orders', 'order', 'a', g, 'order.placed', '{}', now()
			FROM generate_series(1, $1) g`, n)
		require.NoError(t, err)
	}
	insert(100)
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO outbox_wal_parked (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at, commit_lsn)
		VALUES (gen_random_uuid(), 'orders', 'order', 'b', 1, 'order.placed', '{}', now(), '0/16B3748')`)
	require.NoError(t, err)

	rs, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, rs, 3, "00030, and 00031 and 00033 after it")
	require.EqualValues(t, 30, rs[0].Version)
	count := func(q string) (n int) {
		t.Helper()
		require.NoError(t, s.Pool.QueryRow(ctx, q).Scan(&n))
		return n
	}
	require.Equal(t, 100, count(`SELECT count(*) FROM outbox_wal_history WHERE id IS NULL`), "rows written before 00030 keep no id")
	require.Equal(t, 1, count(`SELECT count(*) FROM outbox_wal_parked WHERE position IS NULL`))
	insert(10)
	require.Equal(t, 10, count(`SELECT count(DISTINCT id) FROM outbox_wal_history WHERE id IS NOT NULL`), "rows written after take ids")
	require.Equal(t, 1, count(`SELECT count(*) FROM pg_indexes WHERE tablename = 'outbox_wal_history_20261204'
		AND indexdef LIKE '%(id) WHERE (id IS NOT NULL)'`), "the existing partition has the partial index on id")
	require.Equal(t, 0, count(`SELECT count(*) FROM outbox_wal_receipts`))

	r, err := migrations.Down(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 33, r.Version)
	r, err = migrations.Down(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 31, r.Version)
	r, err = migrations.Down(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 30, r.Version)
	require.Equal(t, 110, count(`SELECT count(*) FROM outbox_wal_history`))
	require.Equal(t, 1, count(`SELECT count(*) FROM outbox_wal_parked`))
	require.Zero(t, count(`SELECT count(*) FROM pg_attribute WHERE attrelid = 'outbox_wal_history'::regclass AND attname IN ('id', 'discarded_at') AND NOT attisdropped`))
}
