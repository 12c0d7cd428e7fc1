package cli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// `outbox discard` and `outbox retry --topic`: a bad flag is named and
// changes nothing; a good one acts on the rows it chooses and says how
// many.
func TestOutboxDiscardCommand(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	ctx := context.Background()
	env := map[string]string{"DATABASE_URL": s.URL}
	parked := func(topic, agg string) int64 {
		var id int64
		require.NoError(t, s.Pool.QueryRow(ctx, `
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			VALUES (gen_random_uuid(), $1, 'payment', $2, 1, 'payment.paid', '{}', now()) RETURNING id`,
			topic, agg).Scan(&id))
		require.NoError(t, outflowtest.ParkRow(ctx, s.Pool, id, 5, "broker said no"))
		return id
	}
	a, b := parked("payments", "a"), parked("refunds", "b")
	state := func() string {
		var st string
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT string_agg(id || ':' || (parked_at IS NOT NULL) || ':' || (discarded_at IS NOT NULL), ',' ORDER BY id)
			FROM outbox_state`).Scan(&st))
		return st
	}
	before := state()
	ids := func(id int64) string { return strconv.FormatInt(id, 10) }

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "discard"}, "invalid --id"},
		{[]string{"outbox", "discard", "--id", ids(a), "--all"}, "give --id or --all, not both"},
		{[]string{"outbox", "discard", "--id", "-3"}, "invalid --id"},
		{[]string{"outbox", "discard", "--all", "--topic", ""}, "invalid --topic"},
		{[]string{"outbox", "retry", "--all", "--topic", " "}, "invalid --topic"},
		{[]string{"outbox", "discard", "--id", ids(a), "--topic", "refunds"}, `not a parked row of topic "refunds"`},
		{[]string{"outbox", "discard", "--id", "999999"}, "row 999999 is not parked"},
		{[]string{"outbox", "discard", "--all", "--topic", "refunds"}, "give --yes"},
	} {
		out, err := command(env, tt.args...).CombinedOutput()
		require.Error(t, err, "%v", tt.args)
		require.Contains(t, string(out), tt.want, "%v", tt.args)
		require.Equal(t, before, state(), "%v changed nothing", tt.args)
	}

	out, err := command(env, "outbox", "discard", "--all", "--topic", "refunds", "--yes").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "discarded 1 parked rows")
	require.Equal(t, ids(a)+":true:false,"+ids(b)+":false:true", state(), "only the topic's row, released and discarded")

	out, err = command(env, "outbox", "retry", "--all", "--topic", "refunds").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "released 0 parked rows")

	out, err = command(env, "outbox", "retry", "--id", ids(a), "--topic", "payments").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "released 1 parked rows")
	require.Equal(t, ids(a)+":false:false,"+ids(b)+":false:true", state(), "a retry does not discard")
}

// `outbox parked` says which rows were discarded and parked again (their
// marker failed), and that a retry sends the marker, not the event; --json
// carries discarded_at for those rows only.
func TestOutboxParkedShowsDiscardedRows(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	ctx := context.Background()
	env := map[string]string{"DATABASE_URL": s.URL, "TZ": "UTC"} // times print in the process's zone
	parked := func(agg, discardedAt string) int64 {
		var id int64
		require.NoError(t, s.Pool.QueryRow(ctx, `
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			VALUES (gen_random_uuid(), 'payments', 'payment', $1, 1, 'payment.paid', '{}', now()) RETURNING id`,
			agg).Scan(&id))
		require.NoError(t, outflowtest.ParkRow(ctx, s.Pool, id, 1, "broker said no"))
		_, err := s.Pool.Exec(ctx, `UPDATE outbox_failures SET discarded_at = nullif($2, '')::timestamptz WHERE id = $1`, id, discardedAt)
		require.NoError(t, err)
		return id
	}
	plain := parked("a", "")
	again := parked("b", "2026-01-02T03:04:05Z")

	out, err := command(env, "outbox", "parked").CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 4, "%s", out)
	require.Contains(t, lines[0], "DISCARDED AT")
	require.Regexp(t, `^`+strconv.FormatInt(plain, 10)+` .* payment/a .* - +broker said no$`, lines[1])
	require.Regexp(t, `^`+strconv.FormatInt(again, 10)+` .* payment/b .* 2026-01-02T03:04:05Z +broker said no$`, lines[2])
	require.Contains(t, lines[3], "discarded, then parked again: what failed is its discard marker")
	require.Contains(t, lines[3], "`outbox retry` sends the marker again, not the event")

	out, err = command(env, "outbox", "parked", "--json").Output()
	require.NoError(t, err, "%s", out)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(out, &rows), "%s", out)
	require.Len(t, rows, 2)
	require.NotContains(t, rows[0], "discarded_at")
	require.Equal(t, "2026-01-02T03:04:05Z", rows[1]["discarded_at"])
}
