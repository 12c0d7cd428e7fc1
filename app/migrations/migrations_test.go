package appmigrations_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/schemadump"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

// legacyDir holds the single-set release's migrations (00001 to 00011,
// framework and app mixed), frozen: the release being upgraded from.
const legacyDir = "../../migrations/testdata/legacy"

// legacyUp migrates s as that release did, up to and including upTo, and,
// from 00007 on (when every table exists), writes a row or more into every
// table.
func legacyUp(t *testing.T, s *outflowtest.Schema, upTo int64) {
	t.Helper()
	ctx := context.Background()
	p, err := goose.NewProvider(goose.DialectPostgres, s.OpenDB(t), os.DirFS(legacyDir),
		goose.WithTableName(migrations.LegacyVersionTable), goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, upTo)
	require.NoError(t, err)
	if upTo < 7 {
		return
	}
	rows, err := os.ReadFile("../../migrations/testdata/legacy_rows.sql")
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, string(rows))
	require.NoError(t, err)
}

// upgrade runs what `outflow migrate up --set app` runs: the framework's set, the
// webhook package's, then the app's; it returns the versions the
// framework's and the app's applied.
func upgrade(ctx context.Context, t *testing.T, s *outflowtest.Schema, libpq bool) (framework, app []int64, err error) {
	db := s.OpenDB(t)
	if libpq {
		db = s.OpenLibPQ(t) // a connection pool of its own, like a separate process
	}
	for _, set := range append([]migrations.Set{migrations.Framework()}, appmigrations.Sets()...) {
		m, err := migrations.NewMigrator(db, set, migrations.Config{})
		if err != nil {
			return nil, nil, err
		}
		rs, err := m.Up(ctx)
		if err != nil {
			return nil, nil, err
		}
		for _, r := range rs {
			switch set.Name {
			case "app":
				app = append(app, r.Version)
			case "outflow":
				framework = append(framework, r.Version)
			}
		}
	}
	return framework, app, nil
}

// freshDefinition is the schema a new install of both sets creates.
func freshDefinition(t *testing.T) string {
	t.Helper()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	def, err := schemadump.Definition(context.Background(), s.Pool, s.Name)
	require.NoError(t, err)
	return def
}

// A database of the single-set release, complete or stopped part way,
// upgrades with `outflow migrate up --set app` and no other step: each set adopts
// the versions already applied, runs only the rest, every row of every
// table (the framework's and the app's) survives, and the schema is a
// fresh install's, plus the old version table, which is left as it was so
// that an instance of the old release starting during the rollout finds
// its migrations applied. Several processes upgrading at once apply each
// migration once.
func TestUpgradeFromSingleSet(t *testing.T) {
	t.Parallel()
	fresh := freshDefinition(t)
	for _, tt := range []struct {
		name          string
		upTo          int64
		framework     []int64 // what the upgrade runs
		app           []int64
		processes     int
		legacyVersion int
	}{
		{"complete", 11, []int64{16, 17, 19, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33}, []int64{12, 13, 14, 15, 18, 21, 32, 34}, 1, 11},
		{"stopped after 00007", 7, []int64{8, 10, 11, 16, 17, 19, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33}, []int64{9, 12, 13, 14, 15, 18, 21, 32, 34}, 1, 7},
		{"stopped after 00003, four processes at once", 3, []int64{4, 5, 8, 10, 11, 16, 17, 19, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33}, []int64{6, 7, 9, 12, 13, 14, 15, 18, 21, 32, 34}, 4, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := outflowtest.NewEmptySchema(t)
			legacyUp(t, s, tt.upTo)
			before, err := schemadump.Rows(ctx, s.Pool, s.Name)
			require.NoError(t, err)

			var framework, app []int64
			var mu sync.Mutex
			var wg sync.WaitGroup
			errs := make(chan error, tt.processes)
			for range tt.processes {
				wg.Go(func() {
					f, a, err := upgrade(ctx, t, s, tt.processes > 1)
					errs <- err
					mu.Lock()
					defer mu.Unlock()
					framework, app = append(framework, f...), append(app, a...)
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.ElementsMatch(t, tt.framework, framework, "each pending framework migration ran once, adopted ones never")
			require.ElementsMatch(t, tt.app, app, "each pending app migration ran once, adopted ones never")

			after, err := schemadump.Rows(ctx, s.Pool, s.Name, migrations.VersionTable, appmigrations.VersionTable)
			require.NoError(t, err)
			for table, rows := range before { // tables created by the upgrade are new, and empty
				cols := columns(t, rows)
				require.Equal(t, project(t, rows, cols), project(t, after[table], cols), "every row of %s survives", table)
			}
			// The Idempotency-Keys stored before API keys existed belong to a
			// placeholder key, revoked: no request can replay them.
			var legacyKeys, ownedByRevoked int
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE a.revoked_at IS NOT NULL AND a.prefix = 'legacy')
				FROM idempotency_keys k JOIN api_keys a ON a.id = k.api_key_id`).Scan(&legacyKeys, &ownedByRevoked))
			require.Equal(t, len(before["idempotency_keys"]), legacyKeys)
			require.Equal(t, legacyKeys, ownedByRevoked)

			var legacyRows int
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM `+migrations.LegacyVersionTable+` WHERE version_id > 0`).Scan(&legacyRows))
			require.Equal(t, tt.legacyVersion, legacyRows)

			def, err := schemadump.Definition(ctx, s.Pool, s.Name, migrations.LegacyVersionTable)
			require.NoError(t, err)
			require.Equal(t, fresh, def, "the upgraded schema is a fresh install's")

			for _, set := range append([]migrations.Set{migrations.Framework()}, appmigrations.Sets()...) {
				m, err := migrations.NewMigrator(s.OpenDB(t), set, migrations.Config{})
				require.NoError(t, err)
				st, err := m.Status(ctx)
				require.NoError(t, err)
				for _, x := range st {
					require.True(t, x.Applied, "%s %d %s", set.Name, x.Version, x.Name)
				}
			}
		})
	}
}

// columns lists the columns of JSON rows.
func columns(t *testing.T, rows []string) map[string]bool {
	t.Helper()
	cols := map[string]bool{}
	for _, r := range rows {
		var row map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(r), &row))
		for k := range row {
			cols[k] = true
		}
	}
	return cols
}

// project keeps cols of each JSON row, sorted: the columns an upgrade added
// (with their defaults) are left out.
func project(t *testing.T, rows []string, cols map[string]bool) []string {
	t.Helper()
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		var row map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(r), &row))
		for k := range row {
			if !cols[k] {
				delete(row, k)
			}
		}
		b, err := json.Marshal(row)
		require.NoError(t, err)
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

// Each set rolls back on its own: the app's down to nothing leaves the
// framework's tables and the webhook package's, and their rows, alone.
func TestDownPerSet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	_, err := s.Pool.Exec(ctx, `INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 't', 'a', '1', 1, 'e', '{}', now())`)
	require.NoError(t, err)
	db := s.OpenDB(t)
	var rolled []int64
	for {
		r, err := appmigrations.Down(ctx, db)
		require.NoError(t, err)
		if r == nil {
			break
		}
		rolled = append(rolled, r.Version)
	}
	require.Equal(t, []int64{34, 32, 21, 18, 15, 14, 13, 12, 9, 7, 6, 3, 2}, rolled)
	rows, err := schemadump.Rows(ctx, s.Pool, s.Name)
	require.NoError(t, err)
	tables := make([]string, 0, len(rows))
	for table := range rows {
		tables = append(tables, table)
	}
	slices.Sort(tables)
	require.Equal(t, []string{appmigrations.VersionTable, "consumer_aggregate_versions", "dead_letters", "outbox",
		"outbox_audit", "outbox_failures", "outbox_forwarders", "outbox_partition_sets", "outbox_partitions", "outbox_receipts",
		"outbox_wal_audit", "outbox_wal_history", "outbox_wal_parked", "outbox_wal_receipts", "outbox_wal_slots", "outflow_claim_bodies", migrations.VersionTable,
		"outflow_operator_actions", schema.VersionTable, "processed_messages",
		"webhook_endpoint_attempts", "webhook_endpoint_deliveries", "webhook_endpoints", "webhook_messages"}, tables)
	require.Len(t, rows["outbox"], 1)

	rs, err := appmigrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, rs, 13)
}

// 00012 on a database that holds Idempotency-Keys: they are kept, owned by
// a revoked placeholder key, so no request can replay them. Its Down keeps
// one row per key value (the newest), which its restored primary key needs.
func TestAPIKeysMigrationKeepsIdempotencyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	db := s.OpenDB(t)
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO api_keys (id, prefix, key_hash) VALUES
		    ('00000000-0000-0000-0000-0000000000a1', 'ofk_a', sha256('a')), ('00000000-0000-0000-0000-0000000000b2', 'ofk_b', sha256('b'));
		INSERT INTO idempotency_keys (api_key_id, key, request_hash, status_code, response_body, created_at) VALUES
		    ('00000000-0000-0000-0000-0000000000a1', 'same', '\x01', 201, 'older', now() - interval '1 hour'),
		    ('00000000-0000-0000-0000-0000000000b2', 'same', '\x02', 201, 'newer', now()),
		    ('00000000-0000-0000-0000-0000000000b2', 'other', '\x03', 200, 'other', now())`)
	require.NoError(t, err)

	for _, later := range []int64{34, 32, 21, 18, 15, 14, 13} { // the later migrations first
		r, err := appmigrations.Down(ctx, db)
		require.NoError(t, err)
		require.Equal(t, later, r.Version)
	}
	r, err := appmigrations.Down(ctx, db)
	require.NoError(t, err)
	require.Equal(t, int64(12), r.Version)
	rows, err := s.Pool.Query(ctx, `SELECT key, convert_from(response_body, 'UTF8') FROM idempotency_keys ORDER BY key`)
	require.NoError(t, err)
	type row struct{ Key, Body string }
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, []row{{"other", "other"}, {"same", "newer"}}, got)

	_, err = appmigrations.Up(ctx, db)
	require.NoError(t, err)
	var n, owned int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE a.prefix = 'legacy' AND a.revoked_at IS NOT NULL)
		FROM idempotency_keys k JOIN api_keys a ON a.id = k.api_key_id`).Scan(&n, &owned))
	require.Equal(t, 2, n, "every row survives the upgrade")
	require.Equal(t, 2, owned, "owned by the revoked placeholder")
	var keys int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&keys))
	require.Equal(t, 1, keys, "the placeholder, and only it")
}

// 00021 drops the console's index of open dead letters, whose job the
// framework's 00020 does; rolling it back restores it, and rolling the
// framework's set back first (dead_letters gone) does not stop the app's
// from rolling back.
func TestConsoleDeadLettersIndexMovedToFramework(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	db := s.OpenDB(t)
	exists := func(index string) bool {
		var ok bool
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, index).Scan(&ok))
		return ok
	}
	require.False(t, exists("console_dead_letters_open_status_idx"))
	require.True(t, exists("dead_letters_open_consumer_status_idx"))
	require.True(t, exists("dead_letters_open_status_idx"))

	downTo21 := func() {
		t.Helper()
		for _, v := range []int64{34, 32, 21} { // 00034 and 00032 first
			r, err := appmigrations.Down(ctx, db)
			require.NoError(t, err)
			require.EqualValues(t, v, r.Version)
		}
	}
	downTo21()
	require.True(t, exists("console_dead_letters_open_status_idx"), "00021's down restores 00018's index")
	_, err := appmigrations.Up(ctx, db)
	require.NoError(t, err)
	require.False(t, exists("console_dead_letters_open_status_idx"))

	// The framework's set first, all of it: dead_letters goes.
	for {
		r, err := migrations.Down(ctx, db)
		require.NoError(t, err)
		if r == nil {
			break
		}
	}
	require.False(t, exists("dead_letters"))
	downTo21() // rolled back without dead_letters
	require.False(t, exists("console_dead_letters_open_status_idx"))
}
