package cli_test

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// A database the single-set release migrated, part way, upgrades with
// `outflow migrate up --set app` alone: each set adopts what that release applied
// and runs only the rest (the full check of rows and schema is in
// app/migrations).
func TestMigrateUpUpgradesSingleSetDatabase(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	p, err := goose.NewProvider(goose.DialectPostgres, s.OpenDB(t), os.DirFS("../../../../migrations/testdata/legacy"),
		goose.WithTableName(migrations.LegacyVersionTable), goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	_, err = p.UpTo(context.Background(), 7)
	require.NoError(t, err)

	env := map[string]string{"DATABASE_URL": s.URL}
	out, err := command(env, "migrate", "up", "--set", "app").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "00001_outbox.sql", "adopted, not run again")
	require.NotContains(t, string(out), "00002_payments.sql", "adopted, not run again")
	for _, want := range []string{"applied outflow 8 ", "applied outflow 10 ", "applied outflow 11 ", "applied app 9 "} {
		require.Contains(t, string(out), want)
	}
	out, err = command(env, "migrate", "status", "--set", "app").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "pending")
}

// `migrate up` without --set app says where the app is installed (here a
// database of the single-set release, its versions in that release's
// table) that its tables were left alone, and says nothing on a service
// whose own tables have the app's names.
func TestMigrateUpNotesTheAppLeftAlone(t *testing.T) {
	t.Parallel()
	legacy := outflowtest.NewEmptySchema(t)
	p, err := goose.NewProvider(goose.DialectPostgres, legacy.OpenDB(t), os.DirFS("../../../../migrations/testdata/legacy"),
		goose.WithTableName(migrations.LegacyVersionTable), goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	_, err = p.UpTo(context.Background(), 7)
	require.NoError(t, err)
	out, err := command(map[string]string{"DATABASE_URL": legacy.URL}, "migrate", "up").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "note: the reference app's tables are installed here and were not migrated: add --set app")

	own := outflowtest.NewSchema(t)
	_, err = own.Pool.Exec(context.Background(), `CREATE TABLE webhook_deliveries (endpoint text)`)
	require.NoError(t, err)
	out, err = command(map[string]string{"DATABASE_URL": own.URL}, "migrate", "up").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "note:")
}
