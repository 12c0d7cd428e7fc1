package forwarder_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// claimPlanEnv is a schema whose 16 partitions are leased to "probe", for
// running the claim statement by hand and reading what its plan read.
func claimPlanEnv(t *testing.T) *outflowtest.Schema {
	t.Helper()
	s := outflowtest.NewSchema(t)
	_, err := s.Pool.Exec(context.Background(), `
		INSERT INTO outbox_partitions (partition, owner, lease_until) SELECT p, 'probe', now() + interval '1 hour' FROM generate_series(0, 15) p;
		INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 16)`)
	require.NoError(t, err)
	return s
}

// insertRows commits n rows in one transaction and returns its id (xid8).
func insertRows(t *testing.T, s *outflowtest.Schema, n int) string {
	t.Helper()
	var xid string
	require.NoError(t, pgx.BeginFunc(context.Background(), s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), `
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			SELECT gen_random_uuid(), 't', 'payment', 'pay-' || g, 1, 'payment.created', '{}', now() FROM generate_series(1, $1) g`, n)
		if err != nil {
			return err
		}
		return tx.QueryRow(context.Background(), `SELECT pg_current_xact_id()::text`).Scan(&xid)
	}))
	return xid
}

// outboxRowsRead sums, over the plan's scans of the outbox's partitions,
// the rows they returned and the rows their filters removed.
func outboxRowsRead(t *testing.T, planJSON string) float64 {
	t.Helper()
	var plans []struct{ Plan map[string]any }
	require.NoError(t, json.Unmarshal([]byte(planJSON), &plans))
	var walk func(n map[string]any) float64
	walk = func(n map[string]any) float64 {
		var sum float64
		if rel, _ := n["Relation Name"].(string); rel == "outbox" || strings.HasPrefix(rel, "outbox_p") && !strings.HasPrefix(rel, "outbox_partition") || rel == "outbox_default" {
			loops, _ := n["Actual Loops"].(float64)
			rows, _ := n["Actual Rows"].(float64)
			removed, _ := n["Rows Removed by Filter"].(float64)
			removedIdx, _ := n["Rows Removed by Index Recheck"].(float64)
			sum += loops*rows + removed + removedIdx
		}
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			sum += walk(c.(map[string]any))
		}
		return sum
	}
	require.Len(t, plans, 1)
	return walk(plans[0].Plan)
}

// A tracked transaction that committed (its rows late) is read from its
// bound up, however many rows lie below: the outbox has no index on
// transaction_id, and the late rows joined to the tracked transactions
// were read from the start of the table once per partition, so each claim
// slowed as the outbox grew (a steady flow of concurrent commits fell
// behind the producers).
func TestClaimReadsLateRowsFromTheirBoundUp(t *testing.T) {
	t.Parallel()
	s := claimPlanEnv(t)
	ctx := context.Background()
	insertRows(t, s, 20000)
	var bound int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&bound))
	var lates []string
	for range 12 {
		lates = append(lates, insertRows(t, s, 1))
		insertRows(t, s, 5)
	}
	var high int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&high))

	parts, highs := make([]int32, 16), make([]int64, 16)
	for i := range parts {
		parts[i], highs[i] = int32(i), high
	}
	bounds := make([]int64, len(lates))
	for i := range bounds {
		bounds[i] = bound
	}
	args := []any{parts, "probe", highs, lates, bounds, []int64{}, parts}
	_, q, _ := forwarder.ClaimStatements(500)

	var lateRows int
	rows, err := s.Pool.Query(ctx, q, args...)
	require.NoError(t, err)
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		if vals[0] == "L" {
			lateRows++
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(lates), lateRows, "the committed tracked transactions' rows are read late")

	var plan string
	require.NoError(t, s.Pool.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q, args...).Scan(&plan))
	read := outboxRowsRead(t, plan)

	require.Less(t, read, 1000.0, "outbox rows the claim read for 72 rows between the late transactions' bound and the highs, with 20,000 below")
}

// On the generic plan PostgreSQL switches a prepared statement to, the
// claim still reads a backlog in id order and stops at the batch: with its
// LIMIT a parameter, the generic plan assumed a large share of the backlog
// was wanted and sorted all of it for each batch.
func TestClaimGenericPlanReadsOnlyTheBatch(t *testing.T) {
	t.Parallel()
	s := claimPlanEnv(t)
	ctx := context.Background()
	insertRows(t, s, 50000)
	_, err := s.Pool.Exec(ctx, `ANALYZE outbox`)
	require.NoError(t, err)

	conn, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	before, q, after := forwarder.ClaimStatements(500)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, before)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `PREPARE claim(int[], text, bigint[], text[], bigint[], bigint[], int[]) AS `+q)
	require.NoError(t, err)
	var plan string
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON)
		EXECUTE claim('{}', 'probe', '{}', '{}', '{}', '{}', '{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}')`).Scan(&plan))
	var plans []struct{ Plan map[string]any }
	require.NoError(t, json.Unmarshal([]byte(plan), &plans))
	require.EqualValues(t, 1+16+500, plans[0].Plan["Actual Rows"], "the snapshot, the 16 partitions and a batch of 500")
	require.Less(t, outboxRowsRead(t, plan), 2000.0, "outbox rows the claim read for a batch of 500 out of a backlog of 50,000")
	_, err = tx.Exec(ctx, after+`; DEALLOCATE claim`)
	require.NoError(t, err)
}

// ReadStats counts as pending exactly the rows outbox_state calls pending
// (the view maps a row to its partition with outbox_partition_of; the
// count computes the partition inline), with two partition sets (a
// repartition under way), cursors at different points per partition,
// published_high above them and a waiting transaction.
func TestReadStatsCountsWhatTheViewCallsPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Before any forwarder made the partitions, every row is pending.
	fresh := outflowtest.NewSchema(t)
	insertRows(t, fresh, 30)
	st, err := forwarder.ReadStats(ctx, fresh.Pool)
	require.NoError(t, err)
	require.EqualValues(t, 30, st.Pending, "rows written before any forwarder ran")

	s := claimPlanEnv(t)
	insertRows(t, s, 2000)
	waiting := insertRows(t, s, 10)
	insertRows(t, s, 2000)
	for _, q := range []string{
		`INSERT INTO outbox_partitions (partition) SELECT generate_series(16, 23)`,
		`INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (3000, 16, 8)`,
		`UPDATE outbox_partitions SET published_through = 500 + partition * 90, published_high = 2200 + partition * 60,
			waiting_xids = ARRAY['` + waiting + `'::xid8]`,
		`INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind)
			SELECT id, aggregate_type, aggregate_id, 'held' FROM outbox WHERE id % 97 = 0`,
	} {
		_, err := s.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	check := func(what string) {
		t.Helper()
		var pending, failing int64
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'pending'),
			count(*) FILTER (WHERE state IN ('failed', 'held', 'repair')) FROM outbox_state`).Scan(&pending, &failing))
		st, err := forwarder.ReadStats(ctx, s.Pool)
		require.NoError(t, err)
		require.NotZero(t, pending, what)
		require.Equal(t, pending+failing, st.Pending, what)
	}
	// The view maps rows inline too (migration 00029), by the rule of
	// outbox_partition_of, which it no longer calls once per row.
	sameAsFunction := func(what string) {
		t.Helper()
		var differ int
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT count(*) FROM outbox o JOIN outbox_state s USING (id)
			LEFT JOIN outbox_partitions p ON p.partition = outbox_partition_of(o.id, o.aggregate_id)
			LEFT JOIN outbox_failures f ON f.id = o.id
			WHERE s.state IS DISTINCT FROM CASE
			    WHEN f.parked_at IS NOT NULL THEN 'parked'
			    WHEN f.id IS NOT NULL THEN f.kind
			    WHEN o.id <= p.published_through OR (o.id <= p.published_high AND o.transaction_id <> ALL(p.waiting_xids)) THEN 'published'
			    ELSE 'pending' END`).Scan(&differ))
		require.Zero(t, differ, "%s: rows whose state differs from outbox_partition_of's mapping", what)
	}
	var plan string
	require.NoError(t, s.Pool.QueryRow(ctx, `EXPLAIN (VERBOSE, FORMAT JSON) SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&plan))
	require.False(t, strings.Contains(plan, "outbox_partition_of"), "the view calls outbox_partition_of once per row")
	check("two partition sets")
	sameAsFunction("two partition sets")
	_, err = s.Pool.Exec(ctx, `DELETE FROM outbox_partition_sets WHERE first_id = 0`)
	require.NoError(t, err)
	check("the new set alone, rows below its first id mapped to it")
	sameAsFunction("the new set alone")
}
