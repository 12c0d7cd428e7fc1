package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// seedReplay writes three published payment events of aggregates p1 and p2
// (two of p1), the bookkeeping of sync-analytics and notify-merchant for
// all of them, an open dead letter of p1 and the projection of two
// merchants.
func seedReplay(t *testing.T, s *outflowtest.Schema) {
	t.Helper()
	_, err := s.Pool.Exec(context.Background(), `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES ('00000000-0000-0000-0000-000000000001', 'payments', 'payment', 'p1', 1, 'payment.created', '{}', '2026-01-01T00:00:00Z'),
		       ('00000000-0000-0000-0000-000000000002', 'payments', 'payment', 'p1', 2, 'payment.paid', '{}', '2026-01-02T00:00:00Z'),
		       ('00000000-0000-0000-0000-000000000003', 'payments', 'payment', 'p2', 1, 'payment.created', '{}', '2026-01-03T00:00:00Z'),
		       ('00000000-0000-0000-0000-000000000004', 'other', 'payment', 'p2', 2, 'x.y', '{}', '2026-01-03T00:00:00Z');
		INSERT INTO processed_messages (message_id, consumer)
		SELECT message_id, c FROM outbox, unnest(ARRAY['sync-analytics', 'notify-merchant']) c;
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
		SELECT c, 'payment', a, 2 FROM unnest(ARRAY['sync-analytics', 'notify-merchant']) c, unnest(ARRAY['p1', 'p2']) a;
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata, status, reason)
		VALUES ('sync-analytics', '00000000-0000-0000-0000-000000000002', 'payment.paid', 'payment', 'p1', 2, '', '{}', 'dead', 'handler failed');
		INSERT INTO merchant_stats_daily (merchant_id, currency, day, paid_count) VALUES ('m1', 'EUR', '2026-01-02', 1), ('m2', 'EUR', '2026-01-02', 1);`)
	require.NoError(t, err)
	var last int64
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT max(id) FROM outbox`).Scan(&last))
	require.NoError(t, outflowtest.PublishThrough(context.Background(), s.Pool, last)) // published, as a forwarder records it
}

// replayState is every row a reset or a replay may touch, in one string.
func replayState(t *testing.T, s *outflowtest.Schema) string {
	t.Helper()
	var out string
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT concat_ws(' | ',
		(SELECT string_agg(consumer || ':' || message_id, ',' ORDER BY consumer, message_id) FROM processed_messages),
		(SELECT string_agg(consumer || ':' || aggregate_id || '@' || version, ',' ORDER BY consumer, aggregate_id) FROM consumer_aggregate_versions),
		(SELECT string_agg(consumer || ':' || status, ',' ORDER BY id) FROM dead_letters),
		(SELECT string_agg(merchant_id, ',' ORDER BY merchant_id) FROM merchant_stats_daily))`).Scan(&out))
	return out
}

// Bad flags of replay and consumer reset name the flag and change nothing;
// a reset off a terminal needs --yes.
func TestReplayCommandFlags(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	seedReplay(t, s)
	before := replayState(t, s)
	env := map[string]string{"DATABASE_URL": s.URL, "OUTFLOW_BROKER": "sql"}
	for _, tt := range []struct{ args, want string }{
		{"replay --aggregate-type payment", "invalid --consumer: required"},
		{"replay --consumer nobody --all", `invalid --topic: required for "nobody"`},
		{"replay --consumer sync-analytics --topic refunds --all", `invalid --topic: sync-analytics reads "payments", not "refunds"`},
		{"replay --consumer sync-analytics", "invalid flags: choose rows"},
		{"replay --consumer sync-analytics --all --event-type payment.paid", "invalid --all"},
		{"replay --consumer sync-analytics --aggregate-id p1", "invalid --aggregate-id: needs --aggregate-type"},
		{"replay --consumer sync-analytics --since yesterday", "invalid --since"},
		{"replay --consumer sync-analytics --until 2026-01-01", "invalid --until"},
		{"replay --consumer sync-analytics --since 2026-01-02T00:00:00Z --until 2026-01-01T00:00:00Z", "invalid --since/--until"},
		{"replay --consumer sync-analytics --all --stream-partitions 0", "invalid --stream-partitions"},
		{"replay --consumer sync-analytics --all --batch-size 0", "invalid --batch-size"},
		{"replay --consumer sync-analytics --all --source kafka", "invalid --source"},
		{"replay --consumer sync-analytics --aggregate-type payment --aggregate-ids-from /nonexistent", "invalid --aggregate-ids-from"},
		{"consumer reset --aggregate-type payment --all-aggregates", "invalid --consumer: required"},
		{"consumer reset --consumer sync-analytics --all-aggregates", "invalid --aggregate-type: required"},
		{"consumer reset --consumer sync-analytics --aggregate-type payment", "invalid flags: give --aggregate-id"},
		{"consumer reset --consumer sync-analytics --aggregate-type payment --aggregate-id p1 --all-aggregates", "invalid --all-aggregates"},
		{"consumer reset --consumer sync-analytics --aggregate-type payment --aggregate-id p1", "give --yes"},
		{"consumer reset --consumer sync-analytics --aggregate-type payment --aggregate-id p1 --yes --projection-sql nonsense", "syntax error"},
	} {
		out, err := command(env, strings.Fields(tt.args)...).CombinedOutput()
		require.Error(t, err, tt.args)
		require.Contains(t, string(out), tt.want, tt.args)
		require.Equal(t, before, replayState(t, s), "%s changed something", tt.args)
	}
}

// consumer reset forgets one consumer's state of the chosen aggregates and
// runs --projection-sql in its transaction; replay --dry-run counts, and
// replay publishes the chosen rows of the consumer's topic to its replay
// topic (the sql broker: a table of the test's schema), nothing else.
func TestConsumerResetAndReplayCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	seedReplay(t, s)
	env := map[string]string{"DATABASE_URL": s.URL, "OUTFLOW_BROKER": "sql"}

	// Any name is taken, so a misspelt one is refused: it has no
	// bookkeeping, and nothing changes.
	before := replayState(t, s)
	out, err := command(env, "consumer", "reset", "--consumer", "sync-analytic", "--aggregate-type", "payment",
		"--all-aggregates", "--yes", "--projection-sql", "DELETE FROM merchant_stats_daily").CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), `invalid --consumer: "sync-analytic" has no bookkeeping in this database, nothing to reset `+
		`(those that have some: notify-merchant, sync-analytics)`)
	require.Equal(t, before, replayState(t, s), "the refused reset changed nothing, its projection SQL unrun")

	out, err = command(env, "consumer", "reset", "--consumer", "sync-analytics", "--aggregate-type", "payment",
		"--aggregate-id", "p1", "--yes", "--projection-sql", "DELETE FROM merchant_stats_daily WHERE merchant_id = 'm1'").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "sync-analytics forgot 1 aggregate(s) of type payment: 1 aggregate version(s), 1 open dead letter(s), 2 processed_messages row(s) from before migration 00026")
	require.Contains(t, string(out), "--projection-sql: 1 row(s)")
	require.Equal(t, "notify-merchant:00000000-0000-0000-0000-000000000001,notify-merchant:00000000-0000-0000-0000-000000000002,"+
		"notify-merchant:00000000-0000-0000-0000-000000000003,notify-merchant:00000000-0000-0000-0000-000000000004,"+
		"sync-analytics:00000000-0000-0000-0000-000000000003,sync-analytics:00000000-0000-0000-0000-000000000004 | "+
		"notify-merchant:p1@2,notify-merchant:p2@2,sync-analytics:p1@0,sync-analytics:p2@2 | m2", replayState(t, s),
		"sync-analytics forgot p1 (its dead letter too: its version back to 0, marked reset), notify-merchant nothing; the projection lost m1")
	require.NotContains(t, string(out), "warning")

	out, err = command(env, "replay", "--consumer", "sync-analytics", "--aggregate-type", "payment", "--dry-run").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "3 outbox row(s) chosen for sync-analytics (topic payments, aggregate type payment)")
	require.Contains(t, string(out), "dry run: nothing published")

	out, err = command(env, "replay", "--consumer", "sync-analytics", "--since", "2026-01-02T00:00:00Z").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "published 2 of 2 row(s) to outflow.replay.sync-analytics")
	rows, err := s.Pool.Query(ctx, `SELECT uuid FROM `+pgx.Identifier{"watermill_outflow.replay.sync-analytics"}.Sanitize()+` ORDER BY "offset"`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"00000000-0000-0000-0000-000000000002", "00000000-0000-0000-0000-000000000003"}, ids,
		"the rows of the consumer's topic since the time, in id order")

	// p1's version 1 purged: the reset says a replay cannot rebuild p1.
	_, err = s.Pool.Exec(ctx, `DELETE FROM outbox WHERE message_id = '00000000-0000-0000-0000-000000000001'`)
	require.NoError(t, err)
	out, err = command(env, "consumer", "reset", "--consumer", "sync-analytics", "--aggregate-type", "payment",
		"--aggregate-id", "p1", "--aggregate-id", "p2", "--yes").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "warning: the outbox no longer holds the first versions of 1 aggregate(s) (p1): "+
		"a replay cannot rebuild them; sync-analytics waits for their missing versions")
}
