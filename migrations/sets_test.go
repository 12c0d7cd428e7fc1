package migrations_test

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// refunds is a service's own set, as a user of the framework keeps it.
func refunds() migrations.Set {
	return migrations.Set{Name: "refunds", FS: os.DirFS("testdata/refunds"), VersionTable: "refunds_schema_migrations"}
}

// Several sets in one call, from a pgx pool or a *sql.DB, in the order
// given; processes running it together apply each migration once (the
// schema's advisory lock), and a second run applies nothing.
func TestUpSets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, from := range []string{"pool", "sql.DB"} {
		t.Run(from, func(t *testing.T) {
			t.Parallel()
			s := outflowtest.NewEmptySchema(t)
			up := func() ([]migrations.Applied, error) {
				if from == "pool" {
					return migrations.UpSetsPool(ctx, s.Pool, migrations.Config{}, migrations.Framework(), refunds())
				}
				return migrations.UpSets(ctx, s.OpenLibPQ(t), migrations.Config{}, migrations.Framework(), refunds())
			}
			var (
				mu  sync.Mutex
				all []migrations.Applied
				wg  sync.WaitGroup
			)
			errs := make(chan error, 3)
			for range 3 {
				wg.Go(func() {
					as, err := up()
					errs <- err
					mu.Lock()
					defer mu.Unlock()
					all = append(all, as...)
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			framework, err := migrations.CurrentStatus(ctx, s.OpenDB(t))
			require.NoError(t, err)
			var want []string
			for _, st := range framework {
				want = append(want, "outflow "+st.Name)
			}
			want = append(want, "refunds 00001_refunds.sql", "refunds 00002_refund_reason.sql")
			var got []string
			for _, a := range all {
				got = append(got, a.Set+" "+a.Name)
			}
			require.ElementsMatch(t, want, got, "each migration once")

			again, err := up()
			require.NoError(t, err)
			require.Empty(t, again)
			require.Contains(t, tables(t, s, s.Name), "refunds")
			require.Contains(t, tables(t, s, s.Name), "refunds_schema_migrations")
			require.NotContains(t, tables(t, s, s.Name), "payments", "nothing of the reference app")
		})
	}
}

// One call applies the sets in order: the framework's ran before the
// service's, whose migrations may build on its tables.
func TestUpSetsOrder(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	as, err := migrations.UpSetsPool(context.Background(), s.Pool, migrations.Config{}, migrations.Framework(), refunds())
	require.NoError(t, err)
	require.Equal(t, "outflow", as[0].Set)
	require.Equal(t, "refunds", as[len(as)-1].Set)
	require.Equal(t, "00002_refund_reason.sql", as[len(as)-1].Name)
}

// Sets that would share a version table, or a name, or none at all, are
// refused before anything runs.
func TestUpSetsRefusesInvalidSets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	clash := refunds()
	clash.Name = "other"
	twin := refunds()
	twin.VersionTable = "twin_schema_migrations"
	legacy := refunds()
	legacy.VersionTable = migrations.LegacyVersionTable
	for name, sets := range map[string][]migrations.Set{
		"none":                 nil,
		"shared version table": {refunds(), clash},
		"same name":            {refunds(), twin},
		"another's AdoptFrom":  {migrations.Framework(), legacy},
		"AdoptFrom set later":  {legacy, migrations.Framework()},
		"invalid set":          {{Name: "bad", FS: os.DirFS("testdata/refunds"), VersionTable: "Bad-Table"}},
	} {
		_, err := migrations.UpSetsPool(ctx, s.Pool, migrations.Config{}, sets...)
		require.ErrorIs(t, err, migrations.ErrInvalidSets, name)
	}
	require.Empty(t, tables(t, s, s.Name), "nothing ran")
}

// A set whose version table names an existing table that is not a goose
// version table (one of the framework's, here) is refused before any of
// its migrations runs, and that table is left as it was.
func TestUpSetsRefusesATableThatIsNotAVersionTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	_, err := s.Pool.Exec(ctx, `INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 't', 'a', '1', 1, 'e', '{}', now())`)
	require.NoError(t, err)
	bad := refunds()
	bad.VersionTable = "outbox"
	_, err = migrations.UpSetsPool(ctx, s.Pool, migrations.Config{}, migrations.Framework(), bad)
	require.ErrorIs(t, err, migrations.ErrNotVersionTable)
	require.NotContains(t, tables(t, s, s.Name), "refunds", "none of the set's migrations ran")
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	require.Equal(t, 1, n, "the table is left as it was")
}
