package claimcheck_test

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/outflowtest"
)

// bodies is a test schema's bodies table seen by its owner.
type bodies struct {
	t *testing.T
	s *outflowtest.Schema
}

func (b bodies) exec(q string, args ...any) {
	b.t.Helper()
	_, err := b.s.Pool.Exec(context.Background(), q, args...)
	require.NoError(b.t, err, q)
}

func (b bodies) count(q string, args ...any) (n int) {
	b.t.Helper()
	require.NoError(b.t, b.s.Pool.QueryRow(context.Background(), q, args...).Scan(&n), q)
	return n
}

// at moves the body of id to created_at t (into t's partition, or the
// default one).
func (b bodies) at(id string, t time.Time) {
	b.exec(`UPDATE outflow_claim_bodies SET created_at = $2 WHERE message_id = $1`, id, t)
}

// gone deletes the event of id from the outbox, as its purge would.
func (b bodies) gone(id string) { b.exec(`DELETE FROM outbox WHERE message_id = $1`, id) }

func (b bodies) partitionExists(day time.Time) bool {
	return b.count(`SELECT count(*) FROM pg_class WHERE relname = $1 AND relnamespace = current_schema()::regnamespace`, dayName(day)) == 1
}

func (b bodies) ids() []string {
	b.t.Helper()
	rows, err := b.s.Pool.Query(context.Background(), `SELECT message_id::text FROM outflow_claim_bodies ORDER BY 1`)
	require.NoError(b.t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b.t, err)
	return ids
}

func dayName(day time.Time) string { return "outflow_claim_bodies_" + day.UTC().Format("20060102") }

// A body written before the first purge landed in the default partition
// (its day had no partition): the purges of the following days skip that
// day's partition instead of failing on it (attaching it would fail,
// 23514), create the next days', and remove the bodies past retention
// whose events are gone, from the default partition and by days dropped
// whole; nothing else.
func TestPurgeAcrossDaysAfterABodyInTheDefaultPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	b := bodies{t, s}
	d0 := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -10)
	const retention = 2 * 24 * time.Hour
	run := func(now time.Time) claimcheck.PurgeStats {
		t.Helper()
		st, err := claimcheck.PurgeBodiesAt(ctx, s.Pool, now, now.Add(-retention), 10)
		require.NoError(t, err, "purge at %s", now)
		require.Empty(t, st.Skipped)
		return st
	}

	a, _ := write(t, s, "a", 5_000)
	b.at(a.MessageID, d0.Add(time.Hour))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outflow_claim_bodies_default`), "before the first purge: no partition for its day")
	b.gone(a.MessageID)

	st := run(d0.Add(2 * time.Hour))
	require.NotContains(t, st.Created, dayName(d0), "the default partition holds that day's bodies")
	for i := 1; i <= claimcheck.DaysAhead; i++ {
		require.Contains(t, st.Created, dayName(d0.AddDate(0, 0, i)))
	}

	// bb: in the partition of d0+2, its event gone; c: in d0+3's, its
	// event kept; e: written today, its event gone, within retention.
	bb, _ := write(t, s, "b", 5_000)
	b.at(bb.MessageID, d0.AddDate(0, 0, 2).Add(time.Hour))
	b.gone(bb.MessageID)
	c, _ := write(t, s, "c", 5_000)
	b.at(c.MessageID, d0.AddDate(0, 0, 3).Add(time.Hour))
	e, _ := write(t, s, "e", 5_000)
	b.gone(e.MessageID)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM `+dayName(d0.AddDate(0, 0, 2))))

	for day := 1; day <= 6; day++ {
		run(d0.AddDate(0, 0, day).Add(2 * time.Hour))
	}
	want := []string{c.MessageID, e.MessageID}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	require.Equal(t, want, b.ids(), "the bodies past retention whose events are gone went, nothing else")
	require.Zero(t, b.count(`SELECT count(*) FROM outflow_claim_bodies_default`), "the default partition's body deleted past the cutoff")
	require.False(t, b.partitionExists(d0.AddDate(0, 0, 2)), "a day past retention dropped whole")
	require.True(t, b.partitionExists(d0.AddDate(0, 0, 3)), "a day with a kept event stays")
}

// roleOf creates a login role that may use s's schema and returns a pool
// connected as it; grants are given to it by the caller.
func roleOf(t *testing.T, s *outflowtest.Schema, suffix string) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	role := strings.ReplaceAll(s.Name, "outflowtest_", "outflowtest_"+suffix+"_")
	id := pgx.Identifier{role}.Sanitize()
	_, err := s.Pool.Exec(ctx, `CREATE ROLE `+id+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		if _, err := s.Pool.Exec(context.Background(), `DROP OWNED BY `+id+`; DROP ROLE `+id); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	_, err = s.Pool.Exec(ctx, `GRANT USAGE ON SCHEMA `+pgx.Identifier{s.Name}.Sanitize()+` TO `+id)
	require.NoError(t, err)
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, id
}

// The purge runs as a role that neither owns the table nor may read a
// body (the forwarder's): granted EXECUTE on migration 00033's functions,
// it creates partitions ahead, drops a day whole and deletes from the
// default partition.
func TestPurgeAsARoleWithoutOwnershipOrSelect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	b := bodies{t, s}
	pool, id := roleOf(t, s, "purger")
	_, err := s.Pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION outflow_claim_bodies_add_day(date), outflow_claim_bodies_drop_day(date),
		outflow_claim_bodies_purge_default(timestamptz, integer) TO `+id)
	require.NoError(t, err)

	now := time.Now()
	oldDay := now.AddDate(0, 0, -20)
	require.NoError(t, claimcheck.EnsurePartitions(ctx, s.Pool, oldDay))
	inDay, _ := write(t, s, "in-day", 5_000)
	b.at(inDay.MessageID, oldDay)
	inDefault, _ := write(t, s, "in-default", 5_000)
	b.at(inDefault.MessageID, now.AddDate(0, 0, -40))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outflow_claim_bodies_default`))
	b.gone(inDay.MessageID)
	b.gone(inDefault.MessageID)

	// It may not read the bodies.
	_, err = claimcheck.Postgres{DB: pool}.Get(ctx, claimcheck.Ref{ID: inDay.MessageID})
	require.ErrorIs(t, err, claimcheck.ErrBodyForbidden)

	// Partitions ahead it creates, owned by the table's owner.
	b.exec(`DROP TABLE ` + dayName(now.AddDate(0, 0, claimcheck.DaysAhead)))
	st, err := claimcheck.PurgeBodies(ctx, pool, now.AddDate(0, 0, -5), 10)
	require.NoError(t, err)
	require.Equal(t, []string{dayName(now.AddDate(0, 0, claimcheck.DaysAhead))}, st.Created)
	require.GreaterOrEqual(t, st.Dropped, 1)
	require.EqualValues(t, 1, st.Deleted)
	require.Empty(t, b.ids(), "both bodies past the cutoff went")
	require.False(t, b.partitionExists(oldDay))
}

// A writer's role that may not INSERT a body is told to grant INSERT,
// not outflow_claim_reader (which gives SELECT only).
func TestPutWithoutInsertNamesTheProducersGrant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	pool, id := roleOf(t, s, "writer")
	_, err := s.Pool.Exec(ctx, `GRANT `+claimcheck.ReaderRole+` TO `+id)
	require.NoError(t, err)
	body := []byte(`{"a":1}`)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return claimcheck.Postgres{}.Put(ctx, txExecer{tx}, []claimcheck.Body{{MessageID: "0193a3c4-7b1e-7c3e-9a51-2f4a0d6c1b22",
			Ref: claimcheck.NewRef("0193a3c4-7b1e-7c3e-9a51-2f4a0d6c1b22", body), Data: body}})
	})
	require.ErrorIs(t, err, claimcheck.ErrStoreForbidden)
	require.NotErrorIs(t, err, claimcheck.ErrBodyForbidden)
	require.ErrorContains(t, err, "grant INSERT ON outflow_claim_bodies")
	require.NotContains(t, err.Error(), "grant "+claimcheck.ReaderRole)
}

type txExecer struct{ tx pgx.Tx }

func (e txExecer) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.tx.Exec(ctx, sql, args...)
	return err
}

// A consumer's transaction reading a body, open for longer than the
// purge's lock timeout, makes it leave the day it would drop to a later
// run, not fail; the day goes at the run after the transaction ended.
func TestPurgeLeavesALockedDayToTheNextRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	b := bodies{t, s}
	now := time.Now()
	oldDay := now.AddDate(0, 0, -20)
	require.NoError(t, claimcheck.EnsurePartitions(ctx, s.Pool, oldDay))
	old, _ := write(t, s, "old", 5_000)
	b.at(old.MessageID, oldDay)
	b.gone(old.MessageID)
	live, body := write(t, s, "live", 5_000)

	reader, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(context.Background()) }()
	var got []byte
	require.NoError(t, reader.QueryRow(ctx, `SELECT body FROM outflow_claim_bodies WHERE message_id = $1`, live.MessageID).Scan(&got))
	require.Equal(t, body, got)

	st, err := claimcheck.PurgeBodies(ctx, s.Pool, now.AddDate(0, 0, -5), 10)
	require.NoError(t, err, "a reader's lock is no failure")
	require.Zero(t, st.Dropped)
	require.Contains(t, st.Skipped, dayName(oldDay))
	require.True(t, b.partitionExists(oldDay))

	require.NoError(t, reader.Rollback(ctx))
	st, err = claimcheck.PurgeBodies(ctx, s.Pool, now.AddDate(0, 0, -5), 10)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Dropped, 1)
	require.False(t, b.partitionExists(oldDay))
	require.Equal(t, []string{live.MessageID}, b.ids())
}

// Several purges at once (forwarder instances and the WAL relay) do not
// fail on each other's partitions: one works, the others skip.
func TestConcurrentPurgesDoNotCollide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	b := bodies{t, s}
	for round := range 5 {
		now := time.Now().AddDate(0, 0, -100+10*round)
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = claimcheck.PurgeBodiesAt(ctx, s.Pool, now, now.AddDate(0, 0, -5), 10)
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
	}
	require.True(t, b.partitionExists(time.Now().AddDate(0, 0, -60+claimcheck.DaysAhead)))
}

// A message whose reference names another event's body (a forged broker
// message copying another event's reference whole: its digest and size
// match that body) is refused before anything is fetched.
func TestResolveRefusesAReferenceToAnotherMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	victim, _ := write(t, s, "victim", 5_000)
	forger, _ := write(t, s, "forger", 5_000)
	forged := published(t, s, forger.MessageID)
	v := published(t, s, victim.MessageID)
	for _, k := range []string{claimcheck.RefKey, claimcheck.SHA256Key, claimcheck.SizeKey} {
		forged.Metadata.Set(k, v.Metadata.Get(k))
	}
	_, err := claimcheck.Resolve(ctx, claimcheck.Postgres{DB: s.Pool}, forged)
	require.ErrorIs(t, err, claimcheck.ErrRefMismatch)
	require.ErrorIs(t, err, claimcheck.ErrBodyTampered)
	require.NotContains(t, err.Error(), "secret-body")
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = claimcheck.ResolveTx(ctx, tx, forged)
	require.ErrorIs(t, err, claimcheck.ErrRefMismatch)
}
