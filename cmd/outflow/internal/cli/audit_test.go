package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/apikey"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Every command that changes state is recorded in the operators' audit:
// the OS user at this host, the command line (secrets masked), what, on
// which rows, how many; a command that fails, with its error and no rows.
// No secret reaches a record: the connection string's password (quoted in
// a flag) nor an API key created. The console's Actions page shows them,
// each target a link. Without the audit's table, a command changes
// nothing: its change and its record commit together, or neither does.
func TestCommandsAreAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	const password = "hunter2-audit-pw"
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), password) // trust auth: unused, but configured
	env := map[string]string{"DATABASE_URL": u.String()}
	run := func(args ...string) string {
		t.Helper()
		out, err := command(env, args...).CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
		return string(out)
	}

	var p1, p2, dead int64
	var mid string
	require.NoError(t, s.Pool.QueryRow(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 'payments', 'payment', 'pay-1', 1, 'payment.paid', '{}', now()) RETURNING id, message_id::text`).Scan(&p1, &mid))
	require.NoError(t, s.Pool.QueryRow(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 'payments', 'payment', 'pay-1', 2, 'payment.paid', '{}', now()) RETURNING id`).Scan(&p2))
	for _, id := range []int64{p1, p2} {
		require.NoError(t, outflowtest.ParkRow(ctx, s.Pool, id, 5, "broker said no"))
	}
	deadLetter := func(version int) int64 {
		var id int64
		require.NoError(t, s.Pool.QueryRow(ctx, `
			INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata, status, reason)
			VALUES ('audit-projection', CASE WHEN $1 = 1 THEN $2::uuid ELSE gen_random_uuid() END, 'payment.paid', 'payment', 'pay-1', $1, '', '{}', 'dead', 'handler failed')
			RETURNING id`, version, mid).Scan(&id))
		return id
	}
	dead = deadLetter(1)

	run("dlq", "retry", "--id", strconv.FormatInt(dead, 10))
	run("outbox", "retry", "--id", strconv.FormatInt(p1, 10))
	run("outbox", "discard", "--all", "--topic", "payments", "--yes")
	out, err := command(env, "dlq", "retry", "--id", "999999").CombinedOutput()
	require.Error(t, err, "%s", out)
	key := strings.TrimSpace(runOut(t, env, "apikey", "create", "--admin", "--name", "auditor"))
	require.NotEmpty(t, key)
	run("consumer", "reset", "--consumer", "audit-projection", "--aggregate-type", "payment", "--aggregate-id", "pay-1",
		"--projection-sql", "SELECT '"+password+"'", "--yes")

	type record struct {
		Kind, ID, Name, Command, Action, Target string
		Count                                   int64
		Error, AggType, AggID                   string
	}
	rows, err := s.Pool.Query(ctx, `SELECT actor_kind, actor_id, actor_name, command, action, target::text, result_count, error,
		coalesce(aggregate_type, ''), coalesce(aggregate_id, '') FROM outflow_operator_actions ORDER BY id`)
	require.NoError(t, err)
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[record])
	require.NoError(t, err)
	require.Len(t, recs, 6)
	for _, r := range recs {
		require.Equal(t, "cli", r.Kind)
		require.Regexp(t, `^\S+@\S+$`, r.ID, "user@host")
		require.True(t, strings.HasPrefix(r.ID, r.Name+"@"), "%s %s", r.ID, r.Name)
	}
	ids := func(id int64) string { return `{"ids": [` + strconv.FormatInt(id, 10) + `]}` }
	for i, want := range []record{
		{Command: "outflow dlq retry --id=" + strconv.FormatInt(dead, 10), Action: "dlq.retry", Target: ids(dead), Count: 1},
		{Command: "outflow outbox retry --id=" + strconv.FormatInt(p1, 10), Action: "outbox.retry", Target: ids(p1), Count: 1},
		{Command: "outflow outbox discard --all --topic=payments --yes", Action: "outbox.discard", Target: `{"all": true, "topic": "payments"}`, Count: 1},
		{Command: "outflow dlq retry --id=999999", Action: "dlq.retry", Target: ids(999999), Count: 0,
			Error: "dead letter 999999: dead letter not found or not dead"},
		{Command: "outflow apikey create --admin --name=auditor", Action: "apikey.create", Count: 1},
		{Command: `outflow consumer reset --aggregate-id=pay-1 --aggregate-type=payment --consumer=audit-projection --projection-sql='SELECT '\''xxxxx'\''' --yes`,
			Action: "consumer.reset", Count: 1, AggType: "payment", AggID: "pay-1",
			Target: `{"consumer": "audit-projection", "aggregate_id": "pay-1", "aggregate_type": "payment", "projection_sql": true}`},
	} {
		got := recs[i]
		require.Equal(t, want.Command, got.Command, "%d", i)
		require.Equal(t, want.Action, got.Action, "%d", i)
		if want.Target != "" {
			require.JSONEq(t, want.Target, got.Target, "%d", i)
		}
		require.Equal(t, want.Count, got.Count, "%d", i)
		require.Equal(t, want.Error, got.Error, "%d", i)
		require.Equal(t, want.AggType, got.AggType, "%d", i)
		require.Equal(t, want.AggID, got.AggID, "%d", i)
	}
	var created struct {
		KeyID  string `json:"key_id"`
		Prefix string `json:"prefix"`
		Name   string `json:"name"`
		Admin  bool   `json:"admin"`
	}
	require.NoError(t, json.Unmarshal([]byte(recs[4].Target), &created))
	require.NotEmpty(t, created.KeyID)
	require.Equal(t, "auditor", created.Name)
	require.True(t, created.Admin)
	require.True(t, strings.HasPrefix(key, created.Prefix), "the key's prefix, which `apikey list` shows")
	var leaks int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outflow_operator_actions a
		WHERE row_to_json(a)::text LIKE '%' || $1 || '%' OR row_to_json(a)::text LIKE '%' || $2 || '%'`, password, key).Scan(&leaks))
	require.Zero(t, leaks, "no secret in any record")

	// The console's Actions page shows them: who, the command line, each
	// target a link (a parked row to its message's journey, the consumer
	// to its dead letters, the aggregate to its journey).
	body := consoleActions(t, s, "/actions?kind=cli")
	require.Contains(t, body, `<p id="actions-total">6 action(s) matching the filter`)
	require.Equal(t, 6, strings.Count(body, `data-kind="cli"`))
	require.Contains(t, body, `<code class="command">outflow dlq retry --id=`+strconv.FormatInt(dead, 10)+`</code>`)
	require.Contains(t, body, `<a href="/journey?q=`+mid+`" class="target-link">row #`+strconv.FormatInt(p1, 10)+`</a>`)
	require.Contains(t, body, `<a href="/dead?consumer=audit-projection" class="target-link">consumer audit-projection</a>`)
	require.Contains(t, body, `<a href="/journey?q=pay-1" class="target-link">payment pay-1</a>`)
	require.Contains(t, body, `<a href="/parked?topic=payments" class="target-link">topic payments</a>`)
	require.Regexp(t, regexp.MustCompile(`(?s)data-action="dlq.retry".*?<td class="error" data-label="Error">dead letter 999999: dead letter not found or not dead</td>`), body)

	// Without the audit's table, nothing is done: the change waits for
	// its record.
	_, err = s.Pool.Exec(ctx, `ALTER TABLE outflow_operator_actions RENAME TO outflow_operator_actions_away`)
	require.NoError(t, err)
	again := deadLetter(2)
	out, err = command(env, "dlq", "retry", "--id", strconv.FormatInt(again, 10)).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "run `outflow migrate up`")
	out, err = command(env, "consumer", "reset", "--consumer", "audit-projection", "--aggregate-type", "payment",
		"--aggregate-id", "pay-1", "--yes").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "run `outflow migrate up`")
	var stillDead int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE id = $1 AND status = 'dead'`, again).Scan(&stillDead))
	require.Equal(t, 1, stillDead, "neither the retry nor the reset (which deletes it) is done unrecorded")
}

// consoleActions logs in to a console of s (the app's tables) and returns
// the page at path.
func consoleActions(t *testing.T, s *outflowtest.Schema, path string) string {
	t.Helper()
	ctx := context.Background()
	c, err := console.New(console.Config{Pool: s.Pool, InsecureCookie: true})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	k, err := apikey.Create(ctx, s.Pool, apikey.New{Name: "viewer"})
	require.NoError(t, err)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar}
	res, err := client.PostForm(srv.URL+"/login", url.Values{"api_key": {k.Secret}})
	require.NoError(t, err)
	res.Body.Close()
	res, err = client.Get(srv.URL + path)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "%s", b)
	return string(b)
}
