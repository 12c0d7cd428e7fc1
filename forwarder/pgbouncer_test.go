package forwarder_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Behind PgBouncer in transaction pooling mode a session keeps nothing
// between transactions (no LISTEN, no named prepared statement): producers
// and forwarder both go through one, with the documented
// default_query_exec_mode=exec, more clients than server connections, and
// every row reaches the stream in per-aggregate order, found by polling.
func TestThroughPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	bouncer := testservers.StartPgBouncer(t, e.schema, 3)
	pool, err := pgxpool.New(ctx, bouncer+"&default_query_exec_mode=exec&pool_max_conns=8")
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	e.run(e.config(func(c *forwarder.Config) { c.Pool = pool }))

	const producers, perAggregate = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			agg := fmt.Sprintf("bouncer-%d", p)
			for v := int64(1); v <= perAggregate; v++ {
				ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: agg, Version: v}, testPayload{N: int(v)})
				if err == nil {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return e.writer.PublishTx(ctx, tx, ev) })
				}
				if err != nil {
					errs <- fmt.Errorf("producer %d, version %d: %w", p, v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	outflowtest.WaitFor(t, 30*time.Second, "every row on the stream", func() bool {
		return len(e.stream()) >= producers*perAggregate
	})
	requireInOrder(t, e.stream(), producers*perAggregate)
	outflowtest.WaitFor(t, 10*time.Second, "every row published, as the cursors recorded at the lease ticks say", func() bool {
		return e.count("published_at IS NULL") == 0
	})
}
