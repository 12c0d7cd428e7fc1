package replay_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

// A reset names the aggregates a replay cannot rebuild: those whose
// retained rows start after version 1, and those the consumer had applied
// that the outbox retains nothing of. A pending row counts as retained;
// an aggregate nobody knows of is not reported. By list and for every
// aggregate alike.
func TestResetReportsPurgedAggregates(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), 't', 'a', id, v, 'e', '{}', now()
		FROM (VALUES ('whole', 1), ('whole', 2), ('late', 3), ('late', 4), ('pending', 1)) AS r (id, v);
		WITH last AS (SELECT max(id) AS id FROM outbox WHERE aggregate_id <> 'pending')
		INSERT INTO outbox_partitions (partition, published_through, published_high, published_through_at)
		SELECT 0, id, id, now() FROM last; -- one partition, published but for the pending row (the last)
		INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 1);
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
		SELECT c, 'a', id, v FROM unnest(ARRAY['c1', 'c2']) c, (VALUES ('whole', 2), ('late', 4), ('gone', 4)) AS r (id, v)`)
	require.NoError(t, err)

	res, err := replay.ResetConsumer(ctx, s.Pool, replay.Reset{Consumer: "c1", AggregateType: "a",
		AggregateIDs: []string{"whole", "late", "pending", "gone", "unseen"}})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Versions)
	require.Equal(t, int64(2), res.Purged)
	require.Equal(t, []string{"gone", "late"}, res.PurgedIDs)

	res, err = replay.ResetConsumer(ctx, s.Pool, replay.Reset{Consumer: "c2", AggregateType: "a", AllAggregates: true})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Versions)
	require.Equal(t, int64(2), res.Purged)
	require.Equal(t, []string{"gone", "late"}, res.PurgedIDs)

	var marked []string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT array_agg(consumer || ':' || aggregate_id ORDER BY consumer, aggregate_id)
		FROM consumer_aggregate_versions WHERE version = 0 AND reset_at IS NOT NULL`).Scan(&marked))
	require.Equal(t, []string{"c1:gone", "c1:late", "c1:pending", "c1:unseen", "c1:whole",
		"c2:gone", "c2:late", "c2:pending", "c2:whole"}, marked,
		"every aggregate chosen, or (all) known to the consumer or retained, is marked reset")
}
