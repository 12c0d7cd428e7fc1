package cli_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The operator tool on the database of a service of a user's own: the
// framework's tables and the user's (a refunds set), nothing of the
// reference app. Every command an operator of that service runs works, or
// gives its normal empty answer, and none creates an app table.
func TestToolOnAnyServiceDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	redisSrv := testservers.StartRedis(t)
	env := map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL}
	run := func(args ...string) string {
		t.Helper()
		out, err := command(env, args...).CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
		return string(out)
	}
	refunds := []string{"--set", "refunds=" + refundsDir, "--version-table", "refunds=refunds_versions"}

	// migrate: the framework's set and the user's.
	require.Contains(t, run(append([]string{"migrate", "up"}, refunds...)...), "applied refunds 2 00002_refund_reason.sql")
	require.NotContains(t, run(append([]string{"migrate", "status"}, refunds...)...), "pending")
	requireNoAppTable(t, s)

	// The service's events: one published and acknowledged by its
	// consumer, one parked by the forwarder, one its consumer dead-lettered.
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO refunds (id, payment_id, amount) VALUES ('00000000-0000-0000-0000-0000000000f1', 'p1', 100);
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES ('00000000-0000-0000-0000-000000000001', 'refunds', 'refund', 'r1', 1, 'refund.requested', '{}', '2026-01-01T00:00:00Z'),
		       ('00000000-0000-0000-0000-000000000002', 'refunds', 'refund', 'r2', 1, 'refund.requested', '{}', '2026-01-02T00:00:00Z');
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
		VALUES ('refunds-projection', 'refund', 'r1', 1);
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata, status, reason)
		VALUES ('refunds-projection', '00000000-0000-0000-0000-000000000001', 'refund.requested', 'refund', 'r1', 1, '', '{}', 'dead', 'handler failed')`)
	require.NoError(t, err)
	var first, second int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT min(id), max(id) FROM outbox`).Scan(&first, &second))
	require.NoError(t, outflowtest.PublishThrough(ctx, s.Pool, first))
	require.NoError(t, outflowtest.ParkRow(ctx, s.Pool, second, 10, "broker said no"))

	// stats: the framework's numbers, the user's consumer, no webhooks.
	var st struct {
		Outbox    map[string]float64         `json:"outbox"`
		Consumers map[string]json.RawMessage `json:"consumers"`
		Webhooks  json.RawMessage            `json:"webhooks"`
	}
	require.NoError(t, json.Unmarshal([]byte(runOut(t, env, "stats", "--json")), &st))
	require.EqualValues(t, 1, st.Outbox["parked"])
	require.JSONEq(t, `null`, string(st.Webhooks))
	require.Contains(t, st.Consumers, "refunds-projection")
	require.NotContains(t, st.Consumers, "notify-merchant", "the reference app's consumers run where its tables are")
	require.Regexp(t, `webhooks\s+not installed`, run("stats"))
	require.Regexp(t, `broker audit\s+not run`, run("stats"), "no forwarder has audited the broker yet")

	// Dead letters.
	var dls []struct {
		ID       int64  `json:"id"`
		Consumer string `json:"consumer"`
	}
	require.NoError(t, json.Unmarshal([]byte(runOut(t, env, "dlq", "list", "--json")), &dls))
	require.Len(t, dls, 1)
	require.Equal(t, "refunds-projection", dls[0].Consumer)
	run("dlq", "retry", "--id", strconv.FormatInt(dls[0].ID, 10))

	// Parked rows.
	require.Contains(t, run("outbox", "parked"), "broker said no")
	run("outbox", "retry", "--id", strconv.FormatInt(second, 10))
	require.Contains(t, run("outbox", "parked"), "no parked rows")

	// A reset, then a replay, of the user's consumer, on the broker.
	require.Contains(t, run("consumer", "reset", "--consumer", "refunds-projection", "--aggregate-type", "refund",
		"--aggregate-id", "r1", "--yes"), "refunds-projection forgot 1 aggregate(s) of type refund")
	require.Contains(t, run("replay", "--consumer", "refunds-projection", "--topic", "refunds", "--aggregate-type", "refund",
		"--aggregate-id", "r1", "--yes"), "published 1 of 1 row(s) to outflow.replay.refunds-projection")

	// A standalone forwarder publishes what is pending (the row retried
	// above), and its broker audit records its state.
	fwd := command(env, "forward", "--metrics-addr", "", "--audit-interval", "200ms")
	var stderr outflowtest.LogBuffer
	fwd.Stderr = &stderr
	require.NoError(t, fwd.Start())
	t.Cleanup(func() { _ = fwd.Process.Kill() })
	outflowtest.WaitFor(t, 30*time.Second, "every row published", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&n))
		return n == 0
	})
	outflowtest.WaitFor(t, 30*time.Second, "the broker audit's state of the refunds topic", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_audit WHERE topic = 'refunds'`).Scan(&n))
		return n > 0
	})
	require.NoError(t, fwd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, fwd.Wait(), "%s", stderr.String())

	var st2 struct {
		Outbox map[string]float64 `json:"outbox"`
		Audit  []struct {
			Mode  string `json:"mode"`
			Topic string `json:"topic"`
		} `json:"audit"`
	}
	require.NoError(t, json.Unmarshal([]byte(runOut(t, env, "stats", "--json")), &st2))
	require.EqualValues(t, 0, st2.Outbox["pending"])
	require.Positive(t, st2.Outbox["published_total"])
	// The broker audit's state, read by the operator.
	require.NotEmpty(t, st2.Audit)
	require.Equal(t, "table", st2.Audit[0].Mode)
	require.Equal(t, "refunds", st2.Audit[0].Topic)
	require.Regexp(t, `(?m)^AUDITED BROKER TOPIC\s+MODE\s+LAST CHECKED.*\n\S+\s+table\s+\S+ ago\s+none\s+0$`, run("stats"))

	// The console: refused without the operator key (naming the setting),
	// then the framework's pages behind it.
	out, err := command(env, "console", "--addr", freeAddr(t)).CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "invalid --console-operator-key-sha256: required on a database without the reference app's tables")
	out, err = command(map[string]string{"DATABASE_URL": s.URL, "CONSOLE_OPERATOR_KEY_SHA256": "abc"}, "console").CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "invalid CONSOLE_OPERATOR_KEY_SHA256: want 64 hex digits")
	con, client, addr, _ := startOperatorConsole(t, map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL},
		"the-refunds-operators-key-0123456789abcdef", "--aggregate-type", "refund")
	conErr := con.Stderr.(*outflowtest.LogBuffer)
	// (The reset above closed the dead letter: no consumer to list.)
	// The commands above are in the audit, which this console (the
	// framework's tables only) shows: who, the command line, the targets.
	for _, pw := range [][2]string{{"/", "Not installed"}, {"/parked", "No parked row"}, {"/dead", ""},
		{"/journey?q=r1", "refund.requested"}, {"/fragments/overview", "outbox-pending"},
		{"/actions", `data-kind="cli" data-action="dlq.retry"`},
		{"/actions", `data-kind="cli" data-action="outbox.retry"`},
		{"/actions", `outflow consumer reset --aggregate-id=r1 --aggregate-type=refund --consumer=refunds-projection --yes`},
		{"/actions", `outflow replay --aggregate-id=r1 --aggregate-type=refund --consumer=refunds-projection --topic=refunds --yes`},
		{"/actions", `<a href="/journey?q=00000000-0000-0000-0000-000000000002" class="target-link">row #` + strconv.FormatInt(second, 10) + `</a>`},
		{"/actions", `<a href="/dead?consumer=refunds-projection" class="target-link">consumer refunds-projection</a>`},
		{"/actions?kind=cli&action=replay", `<p id="actions-total">1 action(s) matching the filter`},
		{"/journey?q=r1", `<tr class="replay"`},
	} {
		page, want := pw[0], pw[1]
		resp, err := client.Get("http://" + addr + page)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", page, conErr.String())
		require.Contains(t, string(b), want, page)
	}
	require.NoError(t, con.Process.Signal(syscall.SIGTERM))
	require.NoError(t, con.Wait(), "%s", conErr.String())

	requireNoAppTable(t, s)
}

// runOut runs the command and returns its standard output alone.
func runOut(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	cmd := command(env, args...)
	var stderr outflowtest.LogBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%v: %s", args, stderr.String())
	return string(out)
}

// A service with a webhook_deliveries table of its own (nothing like the
// app's) and only the framework's set: the tool reads it as a database
// without the reference app, as it is. stats shows no webhooks (it would
// have read the app's columns), the console wants the operator key and
// serves the framework's pages (admin API keys would have been looked for
// in a missing api_keys).
func TestToolOnAServiceWithItsOwnWebhookDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	_, err := s.Pool.Exec(ctx, `CREATE TABLE webhook_deliveries (endpoint text PRIMARY KEY, delivered int NOT NULL);
		INSERT INTO webhook_deliveries VALUES ('https://example.com/hook', 3)`)
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": s.URL}

	var st struct {
		Webhooks json.RawMessage `json:"webhooks"`
	}
	require.NoError(t, json.Unmarshal([]byte(runOut(t, env, "stats", "--json")), &st))
	require.JSONEq(t, `null`, string(st.Webhooks))
	require.Regexp(t, `webhooks\s+not installed`, runOut(t, env, "stats"))

	out, err := command(env, "console", "--addr", freeAddr(t)).CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "invalid --console-operator-key-sha256: required on a database without the reference app's tables")
	con, _, _, b := startOperatorConsole(t, map[string]string{"DATABASE_URL": s.URL}, "the-services-operator-key-0123456789abcdef")
	conErr := con.Stderr.(*outflowtest.LogBuffer)
	require.Contains(t, string(b), "Not installed", "the app's parts are not shown")
	require.NoError(t, con.Process.Signal(syscall.SIGTERM))
	require.NoError(t, con.Wait(), "%s", conErr.String())
	require.Contains(t, conErr.String(), "the framework's pages alone")
}

// startOperatorConsole runs `outflow console` on a free address with the
// SHA-256 of key as its operator key (env gives the rest), waits for it to
// listen, logs in with key and returns the process (its Stderr a
// *outflowtest.LogBuffer), the logged-in client, the address and the page the login
// led to (the overview).
func startOperatorConsole(t *testing.T, env map[string]string, key string, args ...string) (*exec.Cmd, *http.Client, string, []byte) {
	t.Helper()
	sum := sha256.Sum256([]byte(key))
	env = maps.Clone(env)
	env["CONSOLE_INSECURE_COOKIE"] = "true"
	env["CONSOLE_OPERATOR_KEY_SHA256"] = hex.EncodeToString(sum[:])
	addr := freeAddr(t)
	con := command(env, append([]string{"console", "--addr", addr}, args...)...)
	conErr := &outflowtest.LogBuffer{}
	con.Stderr = conErr
	require.NoError(t, con.Start())
	t.Cleanup(func() { _ = con.Process.Kill() })
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar}
	outflowtest.WaitFor(t, 20*time.Second, "the console to listen", func() bool {
		resp, err := client.Get("http://" + addr + "/login")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	resp, err := client.PostForm("http://"+addr+"/login", url.Values{"api_key": {key}})
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the operator key logged in, the overview followed: %s", conErr.String())
	return con, client, addr, b
}
