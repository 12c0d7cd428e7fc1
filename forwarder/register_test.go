package forwarder_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// An instance starting while a repartition is under way waits for it and
// registers; it does not deadlock with it. The repartition is played by a
// transaction that takes the tables in RepartitionOnline's order: the
// partition sets (EXCLUSIVE), then a row of outbox_partitions. The new
// instance's registration is let reach its insert into the sets, where it
// waits, before the repartition writes its partition: with the
// registration holding a table lock of outbox_partitions, that write
// deadlocked with it, and the instance's Run ended in "deadlock detected".
func TestInstanceStartingDuringARepartitionRegisters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, stopA := e.run(e.config(func(c *forwarder.Config) { c.InstanceID = "a" }))
	outflowtest.WaitFor(t, 10*time.Second, "a's partitions", func() bool { return e.countPartitionsOwned() == 16 })
	stopA()

	repartition, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = repartition.Rollback(ctx) }()
	_, err = repartition.Exec(ctx, `LOCK TABLE outbox_partition_sets IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	e.run(e.config(func(c *forwarder.Config) { c.InstanceID = "b" })) // its Run's error fails the test when it stops
	outflowtest.WaitFor(t, 10*time.Second, "b's registration waiting for the sets", func() bool {
		return setsLockWaiters(e) > 0
	})
	_, err = repartition.Exec(ctx, `INSERT INTO outbox_partitions (partition) VALUES (1000)`)
	require.NoError(t, err, "the repartition's write of its partitions")
	require.NoError(t, repartition.Rollback(ctx))
	outflowtest.WaitFor(t, 10*time.Second, "b registered", func() bool {
		return e.countSQL(`SELECT count(*) FROM outbox_forwarders WHERE id = 'b'`) == 1
	})
}

// setsLockWaiters counts the sessions waiting for a lock on this test's
// outbox_partition_sets (pg_stat_activity is the cluster's: another test's
// forwarder waiting on its own schema's table matched a query text).
func setsLockWaiters(e *env) int {
	return e.countSQL(`SELECT count(*) FROM pg_locks WHERE relation = 'outbox_partition_sets'::regclass AND NOT granted`)
}

// A forwarder stopped while it registers (here: waiting for a repartition
// to end) has been shut down, not failed to start: Run returns nil, and
// leaves no registration behind.
func TestStoppedWhileRegisteringIsAShutdown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	hold, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `LOCK TABLE outbox_partition_sets IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	f, err := forwarder.New(e.config())
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	outflowtest.WaitFor(t, 10*time.Second, "the registration waiting for the sets", func() bool { return setsLockWaiters(e) > 0 })
	cancel()
	require.NoError(t, <-done, "a stop while starting")
	require.NoError(t, hold.Rollback(ctx))
	require.Zero(t, e.countSQL(`SELECT count(*) FROM outbox_forwarders`), "no registration left behind")
}
