package forwarder_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Many producers commit one event per transaction as fast as they can,
// beside transactions that write elsewhere, while one forwarder claims as
// fast as it can and asks at every claim which transactions write to the
// outbox (to raise the bounds of the others): every committed row reaches
// the stream. The race this load is meant to exercise (a writer that
// commits between the claim's snapshot and that question, seen with its
// table locks released and its transaction id lock not yet) was found by
// `outflow-bench pipeline -only steady` on a machine saturated by the
// benchmark; this test did not lose a row with the question moved back
// after the snapshot on a quiet machine, so it guards the load, not that
// window (see TestAWriterOfAPartitionIsTakenForAWriter for the
// deterministic half of the fix).
func TestConcurrentCommitsAllReachTheStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	f, err := forwarder.New(e.config())
	require.NoError(t, err)
	f.SetReboundEvery(0)
	e.start(f)
	const producers, perProducer = 16, 400
	ctx := context.Background()
	// A transaction that stays open and writes elsewhere: the cursor
	// tracks it below the highs, so every claim asks about the writers.
	_, err = e.schema.Pool.Exec(ctx, `CREATE TABLE elsewhere (id bigint PRIMARY KEY, n bigint)`)
	require.NoError(t, err)
	long, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(ctx) }()
	_, err = long.Exec(ctx, `INSERT INTO elsewhere VALUES (-1, 0)`)
	require.NoError(t, err)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = make(map[string]bool, producers*perProducer)
	)
	for p := range producers {
		wg.Go(func() {
			agg := aggregates(1)[0]
			for i := range perProducer {
				ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: agg, Version: int64(i + 1)}, testPayload{N: p})
				if err != nil {
					t.Error(err)
					return
				}
				if err := pgx.BeginFunc(ctx, e.schema.Pool, func(tx pgx.Tx) error { return e.writer.PublishTx(ctx, tx, ev) }); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids[ev.MessageID] = true
				mu.Unlock()
			}
		})
	}
	// Transactions that write elsewhere, as a consumer's do: the cursor
	// tracks them, and raises their bounds once it sees they hold no lock
	// on the outbox.
	others, stopOthers := context.WithCancel(ctx)
	var owg sync.WaitGroup
	for o := range 6 {
		owg.Go(func() {
			for i := 0; others.Err() == nil; i++ {
				err := pgx.BeginFunc(others, e.schema.Pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(others, `INSERT INTO elsewhere VALUES ($1, 0) ON CONFLICT (id) DO UPDATE SET n = elsewhere.n + 1`, o*1000+i%50)
					return err
				})
				if err != nil && others.Err() == nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	stopOthers()
	owg.Wait()
	want := producers * perProducer
	var got map[string]bool
	outflowtest.WaitFor(t, 60*time.Second, "every committed row on the stream", func() bool {
		got = map[string]bool{}
		for _, en := range e.stream() {
			got[en.messageID] = true
		}
		return len(got) >= want
	})
	for id := range ids {
		require.True(t, got[id], "message %s committed and never published", id)
	}
}
