package sql_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Trim deletes only what every group has read and is older than the
// retention; the slowest group then reads the rest, from where it was.
func TestSQLTrimKeepsWhatAGroupHasNotRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	b := openSQLBackend(t, s.URL, brokers.SQLConfig{TablePrefix: "t_"})
	trim := func(b brokers.Backend) int64 {
		n, err := b.(brokers.Trimmer).Trim(ctx)
		require.NoError(t, err)
		return n
	}
	for _, err := range b.Broker().Publish(ctx, outgoing("orders", 10, 0)) { // one transaction id for all
		require.NoError(t, err)
	}
	require.Zero(t, trim(b), "no group has acked anything: all kept")
	pool := s.Pool

	// Group positions as watermill-sql stores them: g1 has read all ten,
	// g2 the first four.
	position := func(group string, read int) {
		_, err := pool.Exec(ctx, `INSERT INTO watermill_offsets_t_orders (consumer_group, offset_acked, last_processed_transaction_id)
			SELECT $1, "offset", transaction_id FROM watermill_t_orders ORDER BY transaction_id, "offset" OFFSET $2 LIMIT 1
			ON CONFLICT (consumer_group) DO UPDATE SET offset_acked = excluded.offset_acked,
				last_processed_transaction_id = excluded.last_processed_transaction_id`, group, read-1)
		require.NoError(t, err)
	}
	position("g1", 10)
	position("g2", 4)

	require.Zero(t, trim(b), "younger than the retention (7 days): all kept")
	age(t, pool)
	require.Zero(t, trim(openSQLBackend(t, s.URL, brokers.SQLConfig{TablePrefix: "t_", Retention: -1})), "retention off")
	require.EqualValues(t, 4, trim(b), "what both groups read")
	require.Equal(t, []string{"4", "5", "6", "7", "8", "9"}, consume(t, b, "g2", "orders", 6), "g2 resumes where it was")
	// The position Outflow's subscriber stored (its Close commits what was
	// acked) is one the Trimmer reads: the last six go too.
	require.EqualValues(t, 6, trim(b))
}

// age makes every message of the test's table 8 days old.
func age(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE watermill_t_orders SET created_at = created_at - interval '8 days'`)
	require.NoError(t, err)
}
