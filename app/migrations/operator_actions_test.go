package appmigrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// 00032 copies the console's actions of the earlier releases
// (console_actions) into the framework's audit, once, a replay with its
// aggregate; a console of the earlier release still running during the
// rollout has its inserts copied by the trigger; a down and an up again
// copy nothing twice, and the down stops the copying.
func TestConsoleActionsCopiedToOperatorActions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	db := s.OpenDB(t)
	downTo32 := func() {
		t.Helper()
		for _, v := range []int64{34, 32} { // 00034 first
			r, err := appmigrations.Down(ctx, db)
			require.NoError(t, err)
			require.EqualValues(t, v, r.Version)
		}
	}
	downTo32()

	const key = "00000000-0000-0000-0000-0000000000a1"
	insertOld := func(action, target string, n int) {
		t.Helper()
		_, err := s.Pool.Exec(ctx, `INSERT INTO console_actions (api_key_id, api_key_name, action, target, result_count, error)
			VALUES ($1, 'ops', $2, $3::jsonb, $4, '')`, key, action, target, n)
		require.NoError(t, err)
	}
	insertOld("dlq.retry", `{"ids": [4, 5]}`, 2)
	insertOld("replay", `{"consumer": "analytics", "aggregate_type": "payment", "aggregate_id": "p1"}`, 3)
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, q, args...).Scan(&n))
		return n
	}
	const audit = `SELECT count(*) FROM outflow_operator_actions WHERE actor_kind = 'console' AND actor_id = $1 AND actor_name = 'ops'`
	require.Zero(t, count(audit, key), "not before 00032")

	_, err := appmigrations.Up(ctx, db)
	require.NoError(t, err)
	require.Equal(t, 2, count(audit, key), "each row copied")
	require.Equal(t, 1, count(audit+` AND action = 'dlq.retry' AND target = '{"ids": [4, 5]}' AND result_count = 2
		AND aggregate_id IS NULL`, key))
	require.Equal(t, 1, count(audit+` AND action = 'replay' AND result_count = 3 AND aggregate_type = 'payment' AND aggregate_id = 'p1'`, key),
		"a replay is found by its aggregate, as the journey reads it")
	at := `SELECT count(*) FROM outflow_operator_actions o JOIN console_actions c ON c.at = o.at AND c.action = o.action`
	require.Equal(t, 2, count(at), "at their own time")

	// A console of the earlier release, during the rollout.
	insertOld("outbox.discard", `{"all": true}`, 7)
	require.Equal(t, 1, count(audit+` AND action = 'outbox.discard' AND result_count = 7`, key), "copied as it is written")

	downTo32()
	require.Equal(t, 3, count(audit, key), "the down leaves the copies")
	insertOld("dlq.discard", `{"ids": [9]}`, 1)
	require.Equal(t, 3, count(audit, key), "no trigger after the down")
	_, err = appmigrations.Up(ctx, db)
	require.NoError(t, err)
	require.Equal(t, 4, count(audit, key), "up again: only the row not copied yet")
}
