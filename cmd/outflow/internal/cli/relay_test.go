package cli_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

type walPlaced struct{}

func (walPlaced) EventType() string { return "order.placed" }

// `outflow relay` relays WAL-mode events; `outflow relay recover-slot`
// refuses a slot that is fine, and after one is dropped records the lost
// range and makes a new one.
func TestRelayCommandAndRecoverSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testservers.StartLogicalPostgres(t)
	redisSrv := testservers.StartRedis(t)
	env := map[string]string{"DATABASE_URL": pg.URL, "REDIS_URL": redisSrv.URL}

	relay := command(env, "relay", "--heartbeat-interval", "100ms")
	out := &outflowtest.LogBuffer{}
	relay.Stdout, relay.Stderr = out, out
	require.NoError(t, relay.Start())
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = relay.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = relay.Process.Kill()
		<-exited
	})
	count := func(sql string) int {
		var n int
		require.NoError(t, pg.Pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	outflowtest.WaitFor(t, 30*time.Second, "the slot", func() bool {
		return count(`SELECT count(*) FROM pg_replication_slots WHERE confirmed_flush_lsn IS NOT NULL`) == 1
	})

	w, err := outbox.NewWriter(outbox.Config{Mode: outbox.ModeWAL})
	require.NoError(t, err)
	for v := int64(1); v <= 3; v++ {
		ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: "o1", Version: v}, walPlaced{})
		require.NoError(t, err)
		tx, err := pg.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, w.PublishTx(ctx, tx, ev))
		require.NoError(t, tx.Commit(ctx))
	}
	outflowtest.WaitFor(t, 30*time.Second, "the events relayed (and in the history)", func() bool {
		return count(`SELECT count(*) FROM outbox_wal_history`) == 3
	})

	// The relay's history is a replay source.
	dry, err := command(env, "replay", "--consumer", "sync-analytics", "--all", "--source", "wal_history", "--dry-run").CombinedOutput()
	require.NoError(t, err, string(dry))
	require.Contains(t, string(dry), "from the WAL history")

	rec, err := command(env, "relay", "recover-slot").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(rec), "not lost")

	require.NoError(t, relay.Process.Signal(syscall.SIGTERM))
	<-exited
	require.NoError(t, waitErr, out.String())
	// The relay's backend may still be ending: the slot is active until then.
	outflowtest.WaitFor(t, 20*time.Second, "the slot dropped", func() bool {
		_, err := pg.Pool.Exec(ctx, `SELECT pg_drop_replication_slot('outflow_wal')`)
		return err == nil
	})
	rec, err = command(env, "relay", "recover-slot").CombinedOutput()
	require.NoError(t, err, string(rec))
	require.Contains(t, string(rec), "slot outflow_wal was missing; new slot created.")
	require.Equal(t, 1, count(`SELECT count(*) FROM outbox_wal_slots WHERE lost_status = 'missing' AND lost_from < lost_to`))
}
