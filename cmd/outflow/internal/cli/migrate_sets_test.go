package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
)

// refundsDir is a user's own set: a directory of goose files.
const refundsDir = "../../../../migrations/testdata/refunds"

// schemaTables lists the tables (partitions included) of s's schema.
func schemaTables(t *testing.T, s *outflowtest.Schema) []string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(),
		`SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, s.Name)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

// appTables are the reference app's: none may appear on a database whose
// operator did not ask for the app's set.
var appTables = []string{"api_keys", "app_schema_migrations", "console_actions", "console_sessions", "idempotency_keys",
	"ledger_entries", "ledger_transactions", "merchant_stats_daily", "merchants", "payments", "webhook_attempts", "webhook_deliveries"}

func requireNoAppTable(t *testing.T, s *outflowtest.Schema) {
	t.Helper()
	have := schemaTables(t, s)
	for _, app := range appTables {
		require.NotContains(t, have, app, "nothing of the reference app")
	}
}

// A service's own set, named by directory with the version table it
// chooses, goes up after the framework's, is listed and rolled back on
// its own, and nothing of the reference app is created.
func TestMigrateUserSet(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	env := map[string]string{"DATABASE_URL": s.URL}
	run := func(args ...string) string {
		out, err := command(env, args...).CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
		return string(out)
	}
	refunds := []string{"--set", "refunds=" + refundsDir, "--version-table", "refunds=refunds_versions"}
	up := run(append([]string{"migrate", "up"}, refunds...)...)
	require.Contains(t, up, "applied outflow 1 00001_outbox.sql")
	require.Contains(t, up, "applied refunds 2 00002_refund_reason.sql")
	require.Less(t, strings.Index(up, "applied outflow"), strings.Index(up, "applied refunds"), "the framework's set first")
	require.NotContains(t, up, "note:", "no app here to speak of")
	require.Contains(t, schemaTables(t, s), "refunds")
	require.Contains(t, schemaTables(t, s), "refunds_versions")
	requireNoAppTable(t, s)

	st := run(append([]string{"migrate", "status"}, refunds...)...)
	require.Regexp(t, `refunds\s+2\s+00002_refund_reason.sql\s+applied`, st)
	require.NotContains(t, st, "pending")
	require.NotContains(t, st, "app ")

	require.Contains(t, run(append([]string{"migrate", "down"}, refunds...)...), "rolled back refunds 2 00002_refund_reason.sql")
	require.Regexp(t, `refunds\s+2\s+00002_refund_reason.sql\s+pending`, run(append([]string{"migrate", "status"}, refunds...)...))
	require.Contains(t, run(append([]string{"migrate", "up"}, refunds...)...), "applied refunds 2 00002_refund_reason.sql")
	requireNoAppTable(t, s)
}

// Bad --set and --version-table values are refused before the database is
// touched, by a message naming the flag.
func TestMigrateSetFlagsRefused(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	env := map[string]string{"DATABASE_URL": s.URL}
	empty := t.TempDir()
	file := filepath.Join(t.TempDir(), "x.sql")
	require.NoError(t, os.WriteFile(file, []byte("-- +goose Up\n"), 0o600))
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "up", "--set", "payments"}, `invalid --set "payments": want "outflow", "webhooks", "app" or NAME=DIR`},
		{[]string{"migrate", "status", "--set", "refunds=" + refundsDir + "-nope"}, `invalid --set "refunds=`},
		{[]string{"migrate", "up", "--set", "refunds=" + empty}, "no .sql file in"},
		{[]string{"migrate", "up", "--set", "refunds=" + file}, "is not a directory"},
		{[]string{"migrate", "up", "--set", "refunds="}, "DIR is empty"},
		{[]string{"migrate", "up", "--set", "app=" + refundsDir}, "app is a built-in set"},
		{[]string{"migrate", "up", "--set", "webhooks=" + refundsDir}, "webhooks is a built-in set"},
		{[]string{"migrate", "up", "--set", "refunds=" + refundsDir, "--version-table", "refunds=outflow_webhooks_schema_migrations"},
			`outflow_webhooks_schema_migrations is the webhook package's set's version table`},
		{[]string{"migrate", "up", "--set", "Refunds=" + refundsDir}, `invalid --set "Refunds=`},
		{[]string{"migrate", "up", "--set", "app", "--set", "app"}, "set app given twice"},
		{[]string{"migrate", "up", "--version-table", "refunds"}, `invalid --version-table "refunds": want NAME=TABLE`},
		{[]string{"migrate", "up", "--version-table", "refunds=r"}, "invalid --version-table refunds=r: no --set refunds=DIR"},
		{[]string{"migrate", "up", "--set", "app", "--version-table", "app=x"}, "invalid --version-table app=x: the built-in set app keeps its own"},
		{[]string{"migrate", "up", "--set", "refunds=" + refundsDir, "--version-table", "refunds=outflow_migrations"},
			`invalid --version-table "refunds=outflow_migrations": outflow_migrations is the framework's set's version table`},
		{[]string{"migrate", "down", "--set", "refunds=" + refundsDir, "--version-table", "refunds=outflow_migrations"},
			`invalid --version-table "refunds=outflow_migrations": outflow_migrations is the framework's set's version table`},
		{[]string{"migrate", "up", "--set", "refunds=" + refundsDir, "--version-table", "refunds=app_schema_migrations"},
			`invalid --version-table "refunds=app_schema_migrations": app_schema_migrations is the reference app's set's version table`},
		{[]string{"migrate", "down", "--set", "refunds=" + refundsDir, "--version-table", "refunds=app_schema_migrations"},
			`invalid --version-table "refunds=app_schema_migrations": app_schema_migrations is the reference app's`},
		{[]string{"migrate", "status", "--set", "refunds=" + refundsDir, "--version-table", "refunds=outflow_schema_migrations"},
			`invalid --version-table "refunds=outflow_schema_migrations": outflow_schema_migrations is the version table of the single-set releases`},
		{[]string{"migrate", "down", "--set", "refunds=" + refundsDir, "--version-table", "refunds=outflow_schema_migrations"},
			`invalid --version-table "refunds=outflow_schema_migrations": outflow_schema_migrations is the version table of the single-set releases`},
		{[]string{"migrate", "up", "--set", "refunds=" + refundsDir, "--version-table", "refunds=Bad-Name"},
			`invalid --version-table "refunds=Bad-Name": TABLE must be a lower-case unqualified SQL identifier`},
		{[]string{"migrate", "down"}, "invalid --set: down rolls back one set: name exactly one"},
		{[]string{"migrate", "down", "--set", "outflow", "--set", "app"}, "invalid --set: down rolls back one set"},
	} {
		out, err := command(env, tt.args...).CombinedOutput()
		require.Error(t, err, "%v: %s", tt.args, out)
		require.Contains(t, string(out), tt.want, "%v", tt.args)
	}
	require.Empty(t, schemaTables(t, s), "nothing ran")
}

// A directory set's version table that exists and is not a goose version
// table (the service's own table, one of the framework's) is refused,
// naming the flag that chose it, before any migration of the set runs and
// with the table left as it was.
func TestMigrateRefusesATableThatIsNotAVersionTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	env := map[string]string{"DATABASE_URL": s.URL}
	_, err := s.Pool.Exec(ctx, `CREATE TABLE refunds_log (id int, note text); INSERT INTO refunds_log VALUES (1, 'kept');
		CREATE TABLE refunds_schema_migrations (version_id bigint, note text)`)
	require.NoError(t, err)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "up", "--set", "refunds=" + refundsDir, "--version-table", "refunds=refunds_log"},
			"invalid --version-table refunds=refunds_log: table refunds_log exists and is not a goose version table"},
		{[]string{"migrate", "down", "--set", "refunds=" + refundsDir, "--version-table", "refunds=refunds_log"},
			"invalid --version-table refunds=refunds_log: table refunds_log exists and is not a goose version table"},
		{[]string{"migrate", "status", "--set", "refunds=" + refundsDir, "--version-table", "refunds=refunds_log"},
			"invalid --version-table refunds=refunds_log: table refunds_log exists and is not a goose version table"},
		{[]string{"migrate", "up", "--set", "refunds=" + refundsDir},
			"invalid --set refunds (its version table refunds_schema_migrations): table refunds_schema_migrations exists and is not a goose version table"},
	} {
		out, err := command(env, tt.args...).CombinedOutput()
		require.Error(t, err, "%v: %s", tt.args, out)
		require.Contains(t, string(out), tt.want, "%v", tt.args)
	}
	require.ElementsMatch(t, []string{"refunds_log", "refunds_schema_migrations"}, schemaTables(t, s), "nothing ran")

	// One of the framework's tables, created by the framework's set in the
	// same run: refused by package migrations before the set's first
	// migration, the flag named.
	out, err := command(env, "migrate", "up", "--set", "refunds="+refundsDir, "--version-table", "refunds=outbox").CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "invalid --version-table refunds=outbox:")
	require.Contains(t, string(out), "not a goose version table")
	require.NotContains(t, schemaTables(t, s), "refunds", "none of the set's migrations ran")
	var note string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT note FROM refunds_log`).Scan(&note))
	require.Equal(t, "kept", note)
	out, err = command(env, "migrate", "up", "--set", "refunds="+refundsDir, "--version-table", "refunds=outbox").CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "invalid --version-table refunds=outbox: table outbox exists and is not a goose version table")
}

// `make demo` runs scripts/demo.sh, whose migrate step must name the
// app's set now that it is never applied unasked: run that very line on
// an empty schema, and the app's tables are there for what the demo does
// next (an admin API key first).
func TestDemoScriptMigratesTheApp(t *testing.T) {
	t.Parallel()
	makefile, err := os.ReadFile("../../../../Makefile")
	require.NoError(t, err)
	require.Contains(t, string(makefile), "scripts/demo.sh", "make demo runs the script")
	script, err := os.ReadFile("../../../../scripts/demo.sh")
	require.NoError(t, err)
	var migrate []string
	for line := range strings.Lines(string(script)) {
		if f := strings.Fields(line); len(f) > 1 && f[0] == `"$BIN"` && f[1] == "migrate" {
			require.Nil(t, migrate, "one migrate step")
			migrate = f[1:]
		}
	}
	require.NotNil(t, migrate, "scripts/demo.sh migrates")

	s := outflowtest.NewEmptySchema(t)
	env := map[string]string{"DATABASE_URL": s.URL}
	out, err := command(env, migrate...).CombinedOutput()
	require.NoError(t, err, "%v: %s", migrate, out)
	have := schemaTables(t, s)
	for _, app := range appTables {
		require.Contains(t, have, app)
	}
	out, err = command(env, "apikey", "create", "--admin", "--name", "make-demo").CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// The payments API on a database migrated without the app's set says what
// to run, at start, instead of failing its first request.
func TestServeNamesTheAppSet(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	cmd := command(map[string]string{"DATABASE_URL": s.URL, "HTTP_ADDR": freeAddr(t)}, "serve", "--roles", "api", "--metrics-addr", "")
	var out outflowtest.LogBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		require.Error(t, err, "%s", out.String())
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the API started without the app's tables: %s", out.String())
	}
	require.Contains(t, out.String(), "run `outflow migrate up --set outflow --set app`")
	requireNoAppTable(t, s)
}
