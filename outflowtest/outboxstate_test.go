package outflowtest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// SeedOutboxStates gives every state of outbox_state, and both ways to be
// published or pending by the cursors.
func TestSeedOutboxStatesCoversEveryState(t *testing.T) {
	t.Parallel()
	s := NewSchema(t)
	ctx := context.Background()
	require.NoError(t, SeedOutboxStates(ctx, s.Pool))
	var states []string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT array_agg(DISTINCT state ORDER BY state) FROM outbox_state`).Scan(&states))
	require.Equal(t, []string{"failed", "held", "parked", "pending", "published", "repair"}, states)
	var waitingPending, highPublished int
	require.NoError(t, s.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE s.state = 'pending' AND o.id <= p.published_high),
		       count(*) FILTER (WHERE s.state = 'published' AND o.id > p.published_through)
		FROM outbox o JOIN outbox_state s USING (id)
		JOIN outbox_partitions p ON p.partition = outbox_partition_of(o.id, o.aggregate_id)`).
		Scan(&waitingPending, &highPublished))
	require.Positive(t, waitingPending, "a row of a waiting transaction below published_high")
	require.Positive(t, highPublished, "a row published by published_high")
}
