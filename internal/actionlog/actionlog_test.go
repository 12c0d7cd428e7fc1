package actionlog_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/actionlog"
	"github.com/outflow-dev/outflow/outflowtest"
)

var cli = actionlog.Actor{Kind: actionlog.CLI, ID: "ops@bastion", Name: "ops", Command: "outflow dlq retry --id=1"}

// The change and its record commit in one transaction: a record that
// cannot be written undoes the change (were it written after the commit,
// the change would stay, unrecorded); a change that fails is undone and
// recorded alone, with its error and no rows.
func TestDoCommitsTheChangeWithItsRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	_, err := s.Pool.Exec(ctx, `CREATE TABLE changes (n int)`)
	require.NoError(t, err)
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, q, args...).Scan(&n))
		return n
	}
	change := func(ctx context.Context, tx pgx.Tx) (int64, error) {
		tag, err := tx.Exec(ctx, `INSERT INTO changes VALUES (1), (2)`)
		return tag.RowsAffected(), err
	}

	id, doErr, err := actionlog.Do(ctx, s.Pool, actionlog.Entry{Actor: cli, Action: "dlq.retry", Target: map[string]any{"ids": []int{1}}}, change)
	require.NoError(t, err)
	require.NoError(t, doErr)
	require.Equal(t, 2, count(`SELECT count(*) FROM changes`))
	rec, ok, err := actionlog.Get(ctx, s.Pool, id)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, cli, rec.Actor)
	require.EqualValues(t, 2, rec.Count)
	require.JSONEq(t, `{"ids": [1]}`, string(rec.Target))

	// A target that cannot be encoded: the insert of the record fails,
	// after the change.
	_, _, err = actionlog.Do(ctx, s.Pool, actionlog.Entry{Actor: cli, Action: "dlq.retry", Target: map[string]any{"bad": make(chan int)}}, change)
	require.Error(t, err)
	require.Equal(t, 2, count(`SELECT count(*) FROM changes`), "the change is undone with its record")
	// Aggregate type without its id: the table refuses the record.
	_, _, err = actionlog.Do(ctx, s.Pool, actionlog.Entry{Actor: cli, Action: "replay", Target: struct{}{}, AggregateType: "payment"}, change)
	require.Error(t, err)
	require.Equal(t, 2, count(`SELECT count(*) FROM changes`))
	require.Equal(t, 1, count(`SELECT count(*) FROM outflow_operator_actions`))

	// A change that fails: undone, recorded alone.
	boom := errors.New("boom")
	id, doErr, err = actionlog.Do(ctx, s.Pool, actionlog.Entry{Actor: cli, Action: "dlq.discard", Target: struct{}{}},
		func(ctx context.Context, tx pgx.Tx) (int64, error) {
			n, err := change(ctx, tx)
			require.NoError(t, err)
			return n, boom
		})
	require.NoError(t, err)
	require.ErrorIs(t, doErr, boom)
	require.Equal(t, 2, count(`SELECT count(*) FROM changes`), "nothing of the failed change")
	rec, ok, err = actionlog.Get(ctx, s.Pool, id)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "boom", rec.Error)
	require.Zero(t, rec.Count)
}

// Without the table (00031 not applied), an action is refused, named.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	require.ErrorIs(t, actionlog.Ready(ctx, s.Pool), actionlog.ErrNotMigrated)
	_, _, err := actionlog.Do(ctx, s.Pool, actionlog.Entry{Actor: cli, Action: "x", Target: struct{}{}},
		func(context.Context, pgx.Tx) (int64, error) { return 1, nil })
	require.ErrorIs(t, err, actionlog.ErrNotMigrated)
	require.ErrorContains(t, err, "outflow migrate up")
}

// Pages by keyset, newest first, both ways, under a filter; the actions
// that exist; an aggregate's, newest first, bounded.
func TestListCountActionsOnAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	console := actionlog.Actor{Kind: actionlog.Console, ID: "k1", Name: "ops"}
	var ids []int64
	for i, e := range []actionlog.Entry{
		{Actor: console, Action: "dlq.retry"},
		{Actor: cli, Action: "replay", AggregateType: "payment", AggregateID: "p1"},
		{Actor: console, Action: "replay", AggregateType: "payment", AggregateID: "p1"},
		{Actor: cli, Action: "dlq.retry"},
		{Actor: console, Action: "replay", AggregateType: "payment", AggregateID: "p2"},
		{Actor: cli, Action: "consumer.reset", AggregateType: "payment", AggregateID: "p1"},
	} {
		e.Target, e.Count = map[string]int{"i": i}, int64(i)
		id, err := actionlog.Insert(ctx, s.Pool, e)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	idsOf := func(l actionlog.Listed) []int64 {
		var out []int64
		for _, r := range l.Records {
			out = append(out, r.ID)
		}
		return out
	}
	l, err := actionlog.List(ctx, s.Pool, actionlog.Filter{}, actionlog.Page{Limit: 4})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[5], ids[4], ids[3], ids[2]}, idsOf(l))
	require.True(t, l.Older)
	require.False(t, l.Newer)
	l, err = actionlog.List(ctx, s.Pool, actionlog.Filter{}, actionlog.Page{Before: ids[2], Limit: 4})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[1], ids[0]}, idsOf(l))
	require.False(t, l.Older)
	require.True(t, l.Newer)
	l, err = actionlog.List(ctx, s.Pool, actionlog.Filter{}, actionlog.Page{After: ids[1], Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[3], ids[2]}, idsOf(l), "the two just newer, newest first")
	require.True(t, l.Older)
	require.True(t, l.Newer)

	l, err = actionlog.List(ctx, s.Pool, actionlog.Filter{Kind: actionlog.CLI, Action: "dlq.retry"}, actionlog.Page{Limit: 4})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[3]}, idsOf(l))
	n, err := actionlog.Count(ctx, s.Pool, actionlog.Filter{Action: "replay"})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	n, err = actionlog.Count(ctx, s.Pool, actionlog.Filter{Kind: actionlog.Console})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)

	names, err := actionlog.Actions(ctx, s.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{"consumer.reset", "dlq.retry", "replay"}, names)

	recs, err := actionlog.OnAggregate(ctx, s.Pool, "payment", "p1", "replay", 10)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, ids[2], recs[0].ID, "newest first")
	require.Equal(t, "ops", recs[0].Actor.Name)
	require.Equal(t, "ops@bastion", recs[1].Actor.ID)
	recs, err = actionlog.OnAggregate(ctx, s.Pool, "payment", "p1", "replay", 1)
	require.NoError(t, err)
	require.Len(t, recs, 1)
}
