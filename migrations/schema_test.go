package migrations_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// otherSchema names a schema that does not exist yet, dropped when t ends.
// The name carries s's prefix, so an interrupted run's leftover is dropped
// as s's would be.
func otherSchema(t *testing.T, s *outflowtest.Schema) string {
	t.Helper()
	name := s.Name + "_fw"
	t.Cleanup(func() {
		_, err := s.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		if err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// poolOn connects to schema through the search_path of the URL, as a
// service does.
func poolOn(t *testing.T, s *outflowtest.Schema, schema string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close) // before the schema is dropped (cleanups run last first)
	return pool
}

// Config.Schema puts the set into a schema of its own, creating it, from a
// connection whose search_path is elsewhere, and hands the connection back
// with its search_path untouched.
func TestSchemaOption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewEmptySchema(t)
	target := otherSchema(t, s)
	db := s.OpenDB(t)
	db.SetMaxOpenConns(1) // one session: the one goose migrates on is the one checked after
	var pid int
	var path string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_backend_pid(), current_setting('search_path')`).Scan(&pid, &path))

	m, err := migrations.New(db, migrations.Config{Schema: target})
	require.NoError(t, err)
	rs, err := m.Up(ctx)
	require.NoError(t, err)
	require.Len(t, rs, 21)
	require.Equal(t, frameworkTables, tables(t, s, target))
	require.Empty(t, tables(t, s, s.Name), "nothing in the connection's own schema")

	var pidAfter int
	var pathAfter string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_backend_pid(), current_setting('search_path')`).Scan(&pidAfter, &pathAfter))
	require.Equal(t, pid, pidAfter, "the same session")
	require.Equal(t, path, pathAfter, "the session's search_path is restored")

	again, err := m.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, again)
	st, err := m.Status(ctx)
	require.NoError(t, err)
	for _, x := range st {
		require.True(t, x.Applied, "%d %s", x.Version, x.Name)
	}
	// The default schema's status is another database's: nothing applied.
	st, err = migrations.CurrentStatus(ctx, db)
	require.NoError(t, err)
	for _, x := range st {
		require.False(t, x.Applied, "%d %s", x.Version, x.Name)
	}

	for _, want := range []int64{33, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 20, 19, 17, 16, 11} {
		r, err := m.Down(ctx)
		require.NoError(t, err)
		require.EqualValues(t, want, r.Version)
	}
	identity := func() string {
		var id string
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT attidentity::text FROM pg_attribute
			WHERE attrelid = $1::regclass AND attname = 'id'`, pgx.Identifier{target, "outbox"}.Sanitize()).Scan(&id))
		return id
	}
	require.Equal(t, "a", identity(), "00011 was rolled back in the target schema: outbox.id is an identity again")
	rs, err = m.Up(ctx)
	require.NoError(t, err)
	require.Len(t, rs, 16)
	require.Empty(t, identity())
}

type credited struct {
	Amount int64 `json:"amount"`
}

func (credited) EventType() string { return "account.credited" }

// The runtime qualifies no table: with the search_path of their
// connections naming the schema, the writer, the forwarder and the
// idempotency middleware (claim, dead letters for an out-of-order
// delivery, the consumer_blocked function) all work in a schema that is
// not the default.
func TestRuntimeFindsTablesThroughSearchPath(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := outflowtest.NewEmptySchema(t)
	target := otherSchema(t, s)
	m, err := migrations.New(s.OpenDB(t), migrations.Config{Schema: target})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	pool := poolOn(t, s, target)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Write and forward.
	rdb := testservers.Redis(t)
	topic := testservers.UniqueName(t, rdb)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	require.NoError(t, err)
	var msgs []*message.Message
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for v := int64(1); v <= 2; v++ {
			ev, err := events.New(ctx, events.Aggregate{Type: "account", ID: "a", Version: v}, credited{Amount: 10})
			if err != nil {
				return err
			}
			msg, err := ev.Message(ctx)
			if err != nil {
				return err
			}
			msgs = append(msgs, msg)
			if err := w.PublishTx(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	}))
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	require.NoError(t, err)
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Logger: quiet, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	outflowtest.WaitFor(t, time.Minute, "both rows forwarded", func() bool {
		var pending int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&pending))
		return pending == 0
	})
	stop()
	require.NoError(t, <-done)
	n, err := rdb.XLen(ctx, topic).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n)

	// Consume: version 2 first (held in dead_letters), a duplicate of 1.
	_, err = pool.Exec(ctx, `CREATE TABLE balances (account text PRIMARY KEY, total bigint NOT NULL)`)
	require.NoError(t, err)
	c, err := idempotency.NewConsumer(idempotency.Config{Pool: pool, Consumer: "balances", Logger: quiet,
		RetryPollInterval: 10 * time.Millisecond, GapRetryDelay: 10 * time.Millisecond})
	require.NoError(t, err)
	h := c.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := idempotency.Tx(msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the message context")
		}
		_, err := tx.Exec(msg.Context(), `INSERT INTO balances VALUES ('a', 10)
			ON CONFLICT (account) DO UPDATE SET total = balances.total + 10`)
		return nil, err
	})
	cctx, cstop := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() { cdone <- c.Run(cctx) }()
	for _, m := range []*message.Message{msgs[1], msgs[0], msgs[0]} {
		_, err := h(m.Copy())
		require.NoError(t, err)
	}
	outflowtest.WaitFor(t, time.Minute, "both versions applied once", func() bool {
		var total int64
		err := pool.QueryRow(ctx, `SELECT total FROM balances WHERE account = 'a'`).Scan(&total)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return total == 20
	})
	cstop()
	<-cdone
	var version, held int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT version FROM consumer_aggregate_versions),
		(SELECT count(*) FROM dead_letters)`).Scan(&version, &held))
	require.Equal(t, 2, version)
	require.Equal(t, 1, held, "version 2 went through dead_letters in the schema")
	require.Empty(t, tables(t, s, s.Name), "nothing in the connection's own schema")
}
