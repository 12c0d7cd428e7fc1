package console_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
)

// The overview's reads run at once, so that it takes as long as the
// slowest of them and not their sum: with the four tables they read locked
// by another transaction, all four reads are seen waiting together; read
// one after the other, only one would ever wait.
func TestOverviewReadsConcurrently(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client(t)
	e.login(t, c)
	ctx := context.Background()

	// The lock and the watch on connections of their own: the console's
	// pool is left whole for the overview's reads.
	connect := func() *pgx.Conn {
		conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	locker, watcher := connect(), connect()
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE outbox, dead_letters, webhook_endpoint_deliveries, outbox_partitions IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	type result struct {
		status int
		body   string
	}
	done := make(chan result, 1)
	go func() {
		req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/fragments/overview", nil)
		if err != nil {
			done <- result{body: err.Error()}
			return
		}
		res, err := c.Do(req)
		if err != nil {
			done <- result{body: err.Error()}
			return
		}
		res.Body.Close()
		done <- result{status: res.StatusCode}
	}()

	blocked := func() int {
		var n int
		require.NoError(t, watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`,
			locker.PgConn().PID()).Scan(&n))
		return n
	}
	outflowtest.WaitFor(t, 20*time.Second, "the overview's four reads waiting together", func() bool { return blocked() >= 4 })
	require.NoError(t, tx.Rollback(ctx))
	select {
	case r := <-done:
		require.Equal(t, http.StatusOK, r.status, r.body)
	case <-time.After(20 * time.Second):
		t.Fatal("the overview did not answer once the tables were unlocked")
	}
}
