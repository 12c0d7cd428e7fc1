package migrations_test

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/schemadump"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// legacyUp migrates s as the single-set release did (testdata/legacy holds
// its files, 00001 to 00011, frozen), up to and including upTo, and writes
// a row or more into every table.
func legacyUp(t *testing.T, s *outflowtest.Schema, upTo int64) {
	t.Helper()
	ctx := context.Background()
	p, err := goose.NewProvider(goose.DialectPostgres, s.OpenDB(t), os.DirFS("testdata/legacy"),
		goose.WithTableName(migrations.LegacyVersionTable), goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, upTo)
	require.NoError(t, err)
	rows, err := os.ReadFile("testdata/legacy_rows.sql")
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, string(rows))
	require.NoError(t, err)
}

// cursorColumns matches 00025's columns of outbox_partitions in a row as
// schemadump writes it.
var cursorColumns = regexp.MustCompile(`, "(waiting_xids|published_high|published_through|published_through_at)": [^,}]*`)

// A database of the single-set release, complete or stopped part way,
// upgrades on the next migrations.Up: the framework's set adopts the
// versions already applied (running none of them again), applies the rest,
// and every row is still there. The app's tables are left alone: they are
// not the framework's any more (their own set adopts them, see
// app/migrations).
func TestUpgradeFromSingleSet(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		upTo int64
		want []int64 // what the upgrade runs
	}{
		{"complete", 11, []int64{16, 17, 19, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33}},
		{"stopped after 00007", 7, []int64{8, 10, 11, 16, 17, 19, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := outflowtest.NewEmptySchema(t)
			legacyUp(t, s, tt.upTo)
			before, err := schemadump.Rows(ctx, s.Pool, s.Name)
			require.NoError(t, err)

			rs, err := migrations.Up(ctx, s.OpenDB(t))
			require.NoError(t, err)
			var ran []int64
			for _, r := range rs {
				ran = append(ran, r.Version)
			}
			require.Equal(t, tt.want, ran, "adopted versions are not run again")

			// 00016's, 00027's, 00030's, 00031's and 00033's tables are new, and empty.
			after, err := schemadump.Rows(ctx, s.Pool, s.Name, migrations.VersionTable, "outflow_claim_bodies", "outflow_claim_bodies_default", "outbox_audit", "outbox_receipts", "outbox_failures", "outbox_partition_sets",
				"outbox_wal_history", "outbox_wal_parked", "outbox_wal_slots", "outbox_wal_receipts", "outbox_wal_audit",
				"outflow_operator_actions")
			require.NoError(t, err)
			// 00025 adds the partitions' cursors (checked by
			// TestUpgradeToCursors).
			for i, r := range after["outbox_partitions"] {
				after["outbox_partitions"][i] = cursorColumns.ReplaceAllString(r, "")
			}
			// 00019 and 00023 add nullable columns to the outbox and to
			// the consumers' versions: NULL in every row.
			for table, column := range map[string]string{"outbox": `"discarded_at": null, `, "consumer_aggregate_versions": `"reset_at": null, `} {
				for i, r := range after[table] {
					require.Contains(t, r, column)
					after[table][i] = strings.Replace(r, column, "", 1)
				}
			}
			require.Equal(t, before, after, "every row survives, the old version table's included")

			st, err := migrations.CurrentStatus(ctx, s.OpenDB(t))
			require.NoError(t, err)
			for _, m := range st {
				require.True(t, m.Applied, "%d %s", m.Version, m.Name)
			}
			// Adopted versions keep the time they were applied.
			var differ int
			require.NoError(t, s.Pool.QueryRow(ctx, `
				SELECT count(*) FROM `+migrations.VersionTable+` n
				JOIN `+migrations.LegacyVersionTable+` o USING (version_id) WHERE version_id > 0 AND n.tstamp <> o.tstamp`).Scan(&differ))
			require.Zero(t, differ)

			// The outbox's ids continue after the rows written before.
			var id int64
			require.NoError(t, s.Pool.QueryRow(ctx, `
				INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
				VALUES (gen_random_uuid(), 't', 'a', '1', 1, 'e', '{}', now()) RETURNING id`).Scan(&id))
			require.EqualValues(t, 3, id)

			// Down works on the adopted set: 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 20, 19, 17 and 16 (run here), then 11.
			for _, want := range []int64{33, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 20, 19, 17, 16, 11} {
				r, err := migrations.Down(ctx, s.OpenDB(t))
				require.NoError(t, err)
				require.EqualValues(t, want, r.Version)
			}
		})
	}
}

// Adoption happens once: a later run finds the set's own table and copies
// nothing, although the old table still lists every version.
func TestAdoptionRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	legacyUp(t, s, 11)
	rs, err := migrations.Up(ctx, s.OpenDB(t))
	require.NoError(t, err)
	require.Len(t, rs, 15, "only the versions after the single-set release run: 16, 17, 19, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31 and 33")
	for _, want := range []int64{33, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 20, 19, 17, 16, 11} {
		r, err := migrations.Down(ctx, s.OpenDB(t))
		require.NoError(t, err)
		require.EqualValues(t, want, r.Version)
	}
	rs, err = migrations.Up(ctx, s.OpenDB(t))
	require.NoError(t, err)
	require.Len(t, rs, 16, "11 runs again, then 16, 17, 19, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31 and 33: the rolled-back version is not re-adopted")
}
