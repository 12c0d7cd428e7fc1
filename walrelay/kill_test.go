package walrelay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/walrelay"
)

// childEnv carries the database URL to a relay run in a child process.
const childEnv = "OUTFLOW_WALRELAY_CHILD_URL"

// tableBroker acknowledges a Publish once its messages are committed in
// the table "received": a durable broker that outlives a killed relay.
type tableBroker struct{ pool *pgxpool.Pool }

func (b tableBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	ids := make([]string, len(msgs))
	aggs := make([]string, len(msgs))
	versions := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i], aggs[i], versions[i] = m.Message.UUID, m.AggregateID, m.Message.Metadata.Get(events.AggregateVersionKey)
	}
	_, err := b.pool.Exec(ctx, `INSERT INTO received (message_id, aggregate_id, version)
		SELECT m::uuid, a, v::bigint FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS x(m, a, v, o) ORDER BY o`,
		ids, aggs, versions)
	errs := make([]error, len(msgs))
	if err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %w", forwarder.ErrBrokerUnavailable, err)
		}
	}
	return errs
}

// TestRelayChildProcess is the relay TestKillRelayUnderLoad runs, and
// kills, in child processes; on its own it has nothing to do.
func TestRelayChildProcess(t *testing.T) {
	url := os.Getenv(childEnv)
	if url == "" {
		return // run by TestKillRelayUnderLoad, in its child processes
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	r, err := walrelay.New(walrelay.Config{Pool: pool, Broker: tableBroker{pool: pool}, StandbyRetry: 100 * time.Millisecond,
		HeartbeatInterval: 200 * time.Millisecond, MaxChanges: 2000, Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, r.Run(ctx))
}

func TestKillRelayUnderLoad(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.pg.Pool.Exec(ctx, `CREATE TABLE received (id bigserial PRIMARY KEY, message_id uuid NOT NULL, aggregate_id text NOT NULL, version bigint NOT NULL)`)
	require.NoError(t, err)

	var mu sync.Mutex
	children := map[string]*exec.Cmd{}
	exited := map[string]chan struct{}{}
	n := 0
	start := func() {
		n++
		name := fmt.Sprintf("relay-%d", n)
		cmd := exec.Command(os.Args[0], "-test.run=^TestRelayChildProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+e.pg.URL+"&application_name="+name)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		require.NoError(t, cmd.Start())
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		mu.Lock()
		children[name], exited[name] = cmd, done
		mu.Unlock()
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for name, c := range children {
			_ = c.Process.Kill()
			<-exited[name]
		}
	})
	start()
	e.waitSlot(30 * time.Second)
	start() // the standby

	// Producers: 4 of them, each with aggregates of its own, versions in
	// order, transactions of 1 to 3 events.
	type produced struct {
		id      string
		agg     string
		version int64
	}
	var (
		pmu  sync.Mutex
		all  []produced
		wg   sync.WaitGroup
		halt = make(chan struct{})
	)
	for p := range 4 {
		wg.Go(func() {
			versions := map[string]int64{}
			for i := 0; ; i++ {
				select {
				case <-halt:
					return
				default:
				}
				var evs []events.Event
				for k := range 1 + i%3 {
					agg := fmt.Sprintf("p%d-a%d", p, (i+k)%5)
					versions[agg]++
					evs = append(evs, e.event(agg, versions[agg]))
				}
				tx, err := e.pg.Pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := e.writer.PublishTx(ctx, tx, evs...); err != nil {
					t.Error(err)
					return
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				pmu.Lock()
				for _, ev := range evs {
					all = append(all, produced{ev.MessageID, ev.AggregateID, ev.AggregateVersion})
				}
				pmu.Unlock()
			}
		})
	}

	leader := func() string {
		var name string
		err := e.pg.Pool.QueryRow(ctx, `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted LIMIT 1`).Scan(&name)
		if err != nil {
			return ""
		}
		return name
	}
	for kill := range 6 {
		from := e.count(`SELECT count(*) FROM received`)
		var name string
		outflowtest.WaitFor(t, 60*time.Second, fmt.Sprintf("progress before kill %d", kill+1), func() bool {
			name = leader()
			return name != "" && e.count(`SELECT count(*) FROM received`) >= from+50
		})
		mu.Lock()
		cmd, done := children[name], exited[name]
		mu.Unlock()
		require.NotNil(t, cmd, name)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		<-done
		mu.Lock()
		delete(children, name)
		mu.Unlock()
		start() // the next standby
	}
	close(halt)
	wg.Wait()
	pmu.Lock()
	defer pmu.Unlock()
	require.NotEmpty(t, all)
	outflowtest.WaitFor(t, 120*time.Second, "every produced event received", func() bool {
		return e.count(`SELECT count(DISTINCT message_id) FROM received`) == len(all)
	})

	// Nothing lost, duplicates only: every event is there, and each
	// aggregate's events first arrived in their order.
	rows, err := e.pg.Pool.Query(ctx, `SELECT message_id::text, aggregate_id, version FROM received ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	seen := map[string]bool{}
	next := map[string]int64{}
	total := 0
	for rows.Next() {
		var id, agg string
		var v int64
		require.NoError(t, rows.Scan(&id, &agg, &v))
		total++
		if seen[id] {
			continue
		}
		seen[id] = true
		require.Equal(t, next[agg]+1, v, "aggregate %s: first arrivals in order", agg)
		next[agg] = v
	}
	require.NoError(t, rows.Err())
	for _, p := range all {
		require.True(t, seen[p.id], "event %s of %s v%d lost", p.id, p.agg, p.version)
	}
	t.Logf("%d events, %d received (%d duplicates) across 6 kills of the reading relay", len(all), total, total-len(all))
}
