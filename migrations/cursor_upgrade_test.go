package migrations_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

type upgraded struct {
	N int `json:"n"`
}

func (upgraded) EventType() string { return "test.upgraded" }

// A database of 00024, with rows published, pending, failing, parked,
// held behind a parked one and discarded, moves to the cursors of 00025
// while producers keep writing: every row keeps its state (read through
// outbox_state), the forwarder then publishes each pending row once in its
// aggregate's order, the parked rows stay parked until retried, and no
// committed row is lost, those written during the migration included.
func TestUpgradeToCursorsOnline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := outflowtest.NewEmptySchema(t)
	db := s.OpenDB(t)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS(),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 24)
	require.NoError(t, err)

	rdb := testservers.Redis(t)
	topic := testservers.UniqueName(t, rdb)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	require.NoError(t, err)
	write := func(agg string, v int64) {
		t.Helper()
		ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: agg, Version: v}, upgraded{N: int(v)})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))
	}
	for _, r := range []struct {
		agg string
		v   int64
	}{{"pub", 1}, {"pub", 2}, {"pend", 1}, {"pend", 2}, {"pend", 3}, {"fail", 1}, {"fail", 2}, {"park", 1}, {"park", 2}, {"disc", 1}} {
		write(r.agg, r.v)
	}
	// The states a forwarder of 00024 leaves, on the rows themselves.
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO outbox_partitions (partition) SELECT generate_series(0, 3);
		UPDATE outbox SET published_at = now() - interval '1 minute', attempts = 1
		    WHERE aggregate_id = 'pub' OR (aggregate_id = 'pend' AND aggregate_version = 1);
		UPDATE outbox SET attempts = 2, last_error = 'refused', next_attempt_at = now() - interval '1 second'
		    WHERE aggregate_id = 'fail' AND aggregate_version = 1;
		UPDATE outbox SET attempts = 10, last_error = 'refused', parked_at = now()
		    WHERE aggregate_id IN ('park', 'disc') AND aggregate_version = 1;
		UPDATE outbox SET discarded_at = now() WHERE aggregate_id = 'disc';
		UPDATE outbox SET next_attempt_at = now() WHERE aggregate_id = 'park' AND aggregate_version = 2;`)
	require.NoError(t, err)

	// Producers keep writing while the migration runs.
	var (
		wg      sync.WaitGroup
		live    atomic.Int64
		stopped atomic.Bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := int64(1); !stopped.Load(); v++ {
			ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: "live", Version: v}, upgraded{N: int(v)})
			if err == nil {
				err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) })
			}
			if err != nil {
				t.Errorf("producer: %v", err)
				return
			}
			live.Store(v)
		}
	}()
	outflowtest.WaitFor(t, 10*time.Second, "producers writing", func() bool { return live.Load() >= 20 })
	rs, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 25, rs[0].Version)
	require.EqualValues(t, 33, rs[len(rs)-1].Version, "the outbox partitioned, online too, and what came after")
	atMigration := live.Load()
	outflowtest.WaitFor(t, 10*time.Second, "producers writing after the migration", func() bool { return live.Load() >= atMigration+20 })

	state := func(agg string, v int64) (st string, attempts int, discarded bool) {
		t.Helper()
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT s.state, s.attempts, s.discarded_at IS NOT NULL FROM outbox o JOIN outbox_state s USING (id)
			WHERE o.aggregate_id = $1 AND o.aggregate_version = $2`, agg, v).Scan(&st, &attempts, &discarded))
		return st, attempts, discarded
	}
	for _, c := range []struct {
		agg       string
		v         int64
		state     string
		attempts  int
		discarded bool
	}{
		{"pub", 2, "published", 0, false},
		{"pend", 1, "published", 0, false},
		{"pend", 2, "pending", 0, false},
		{"fail", 1, "failed", 2, false},
		{"fail", 2, "pending", 0, false},
		{"park", 1, "parked", 10, false},
		{"park", 2, "held", 0, false},
		{"disc", 1, "parked", 10, true},
	} {
		st, attempts, discarded := state(c.agg, c.v)
		require.Equal(t, c.state, st, "%s v%d", c.agg, c.v)
		require.Equal(t, c.attempts, attempts, "%s v%d", c.agg, c.v)
		require.Equal(t, c.discarded, discarded, "%s v%d", c.agg, c.v)
	}

	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, err := forwarder.New(forwarder.Config{Pool: s.Pool, Broker: broker, Logger: quiet, Partitions: 4,
		PollInterval: 20 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	stopped.Store(true)
	wg.Wait()
	total := live.Load()

	// What reached the stream: per aggregate, the first delivery of each
	// version, in order.
	firsts := func() map[string][]int64 {
		entries, err := rdb.XRange(ctx, topic, "-", "+").Result()
		require.NoError(t, err)
		seen := map[string]bool{}
		out := map[string][]int64{}
		for _, e := range entries {
			msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
			require.NoError(t, err)
			env, err := events.EnvelopeFromMessage(msg)
			require.NoError(t, err)
			if seen[env.MessageID] {
				continue
			}
			seen[env.MessageID] = true
			out[env.AggregateID] = append(out[env.AggregateID], env.AggregateVersion)
		}
		return out
	}
	seq := func(from, to int64) []int64 {
		var out []int64
		for v := from; v <= to; v++ {
			out = append(out, v)
		}
		return out
	}
	outflowtest.WaitFor(t, time.Minute, "every row but the parked ones and those held behind them published", func() bool {
		got := firsts()
		return len(got["live"]) == int(total) && len(got["pend"]) >= 2 && len(got["fail"]) == 2
	})
	got := firsts()
	require.Equal(t, seq(1, total), got["live"], "every row written, before, during and after the migration, in order")
	require.Equal(t, []int64{1, 2}, got["fail"], "the failing row went out first, then the one behind it")
	require.Equal(t, []int64{2, 3}, got["pend"][len(got["pend"])-2:], "the pending rows, in order")
	require.Empty(t, got["park"], "a parked row and the row held behind it stay")
	require.Empty(t, got["disc"])
	st, _, _ := state("park", 2)
	require.Equal(t, "held", st)

	n, err := forwarder.RetryParked(ctx, s.Pool, forwarder.ParkedFilter{})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	outflowtest.WaitFor(t, time.Minute, "the retried rows published", func() bool {
		got := firsts()
		return len(got["park"]) == 2 && len(got["disc"]) == 1
	})
	got = firsts()
	require.Equal(t, []int64{1, 2}, got["park"], "the retried row, then the one held behind it")
}
