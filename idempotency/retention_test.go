package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/outflowtest"
)

const testRetention = 15 * 24 * time.Hour

func newRetention(t *testing.T, pool *pgxpool.Pool, batch int) *idempotency.Retention {
	t.Helper()
	r, err := idempotency.NewRetention(idempotency.RetentionConfig{Pool: pool, Retention: testRetention, BatchSize: batch,
		Interval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return r
}

// age moves rows of table matching where back by d, as if they were written
// that long ago.
func age(t *testing.T, pool *pgxpool.Pool, table, column, where string, d time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(),
		fmt.Sprintf(`UPDATE %s SET %s = %s - $1::interval WHERE %s`, table, column, column, where), d.String())
	require.NoError(t, err)
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// addDeadLetter inserts a dead_letters row in status, created and (when
// closed) resolved agoDays ago.
func addDeadLetter(t *testing.T, pool *pgxpool.Pool, status string, agoDays int) string {
	t.Helper()
	id := uuid.NewString()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
		                          payload, metadata, status, reason, created_at, resolved_at)
		VALUES ('balances', $1::uuid, 'account.credited', 'account', 'dl-' || $1::text, 1, '\x7b7d', '{}', $2, 'test',
		        now() - make_interval(days => $3),
		        CASE WHEN $2::text IN ('resolved', 'discarded') THEN now() - make_interval(days => $3) END)`,
		id, status, agoDays)
	require.NoError(t, err)
	return id
}

// addProcessed inserts n processed_messages rows written agoDays ago, as a
// consumer of an earlier release wrote them.
func addProcessed(t *testing.T, pool *pgxpool.Pool, n, agoDays int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO processed_messages (message_id, consumer, processed_at)
		SELECT gen_random_uuid(), 'balances', now() - make_interval(days => $2) FROM generate_series(1, $1)`, n, agoDays)
	require.NoError(t, err)
}

// processed_messages goes whole, in one TRUNCATE, once its newest row is
// past the retention, and not a row before: old rows next to a recent one
// stay (a consumer of an earlier release still writes it). Dead letters go
// row by row when closed and old; versions never.
func TestRetentionPurgesOnlyOldClosedBookkeeping(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{})
	pool := b.schema.Pool
	ctx := context.Background()
	for v := int64(1); v <= 5; v++ {
		for a := range 4 {
			_, err := h(msgFor(t, fmt.Sprintf("acct-%d", a), v))
			require.NoError(t, err)
		}
	}
	require.Zero(t, count(t, pool, `SELECT count(*) FROM processed_messages`), "the consumer writes no row per message")
	addProcessed(t, pool, 12, 16)
	addProcessed(t, pool, 1, 2)
	// Dead letters: old closed ones go; open ones stay whatever their age;
	// recent closed ones stay.
	for _, s := range []string{"resolved", "discarded", "resolved"} {
		addDeadLetter(t, pool, s, 20)
	}
	for _, s := range []string{"retrying", "dead", "held"} {
		addDeadLetter(t, pool, s, 30)
	}
	addDeadLetter(t, pool, "resolved", 2)
	versions := count(t, pool, `SELECT count(*) FROM consumer_aggregate_versions`)
	require.Equal(t, 4, versions)

	r := newRetention(t, pool, 2) // several batches of dead letters
	n, err := r.PurgeOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "the 3 old closed dead letters; processed_messages has a recent row")
	require.Equal(t, 13, count(t, pool, `SELECT count(*) FROM processed_messages`),
		"old rows next to a recent one are kept: never deleted row by row")
	require.Equal(t, 3, count(t, pool, `SELECT count(*) FROM dead_letters WHERE status IN ('retrying', 'dead', 'held')`),
		"open dead letters are never purged")
	require.Equal(t, 4, count(t, pool, `SELECT count(*) FROM dead_letters`))

	// The newest row ages past the retention: the table goes whole.
	age(t, pool, "processed_messages", "processed_at", "processed_at > now() - interval '3 days'", 14*24*time.Hour)
	var relfile int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_relation_filenode('processed_messages')::bigint`).Scan(&relfile))
	n, err = r.PurgeOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 13, n, "every processed row, counted before the truncate")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM processed_messages`))
	var after int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_relation_filenode('processed_messages')::bigint`).Scan(&after))
	require.NotEqual(t, relfile, after, "truncated (a new file), not deleted row by row")
	require.Equal(t, versions, count(t, pool, `SELECT count(*) FROM consumer_aggregate_versions`),
		"aggregate versions are never purged")
	require.Equal(t, 4, count(t, pool, `SELECT count(*) FROM dead_letters`))

	n, err = r.PurgeOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a second purge finds nothing")
}

// A redelivery, however old, is skipped by the aggregate's stored version:
// the version applied last is a duplicate, one below it stale; nothing is
// recorded per message, and the handler does not run.
func TestRedeliveryIsSkippedByTheVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		ordering idempotency.Ordering
	}{
		{"strict", idempotency.Strict},
		{"latest wins", idempotency.LatestWins},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			b, h := setup(t, idempotency.Config{Ordering: tt.ordering, Metrics: reg, Topic: "t"})
			pool := b.schema.Pool
			var msgs []*message.Message
			for v := int64(1); v <= 3; v++ {
				m := msgFor(t, "a", v)
				msgs = append(msgs, m.Copy())
				_, err := h(m)
				require.NoError(t, err)
			}
			calls := b.calls
			for _, m := range msgs { // the broker sends all three again, the latest included
				_, err := h(m.Copy())
				require.NoError(t, err, "a redelivery is acknowledged")
			}
			require.Equal(t, calls, b.calls, "the handler did not run")
			total, applied := b.balance("a")
			require.EqualValues(t, 30, total, "no second effect")
			require.Equal(t, []int64{1, 2, 3}, applied)
			require.Zero(t, count(t, pool, `SELECT count(*) FROM dead_letters`), "nothing parked as a gap")
			require.Zero(t, count(t, pool, `SELECT count(*) FROM processed_messages`), "nothing recorded per message")
			require.Equal(t, 1.0, metricValue(t, reg, "outflow_consumer_duplicates_total", "balances", "t"), "version 3, the one applied last")
			require.Equal(t, 2.0, metricValue(t, reg, "outflow_consumer_stale_total", "balances", "t"), "versions 1 and 2")

			_, err := h(msgFor(t, "a", 4))
			require.NoError(t, err)
			_, applied = b.balance("a")
			require.Equal(t, []int64{1, 2, 3, 4}, applied, "the next version still applies")
		})
	}
}

func TestRetentionSkipsWhileAnotherPurges(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `INSERT INTO processed_messages (message_id, consumer, processed_at) VALUES ($1, 'c', now() - interval '20 days')`, uuid.New())
	require.NoError(t, err)
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	// The purge's advisory lock, as another process's purge holds it.
	held, err := advisory.Try(ctx, tx, advisory.ConsumerRetention)
	require.NoError(t, err)
	require.True(t, held)

	r := newRetention(t, s.Pool, 10)
	n, err := r.PurgeOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the lock is taken: nothing purged, no waiting")
	require.NoError(t, tx.Rollback(ctx))
	n, err = r.PurgeOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func TestRetentionRunPurgesUntilCancelled(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := newRetention(t, s.Pool, 10)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO processed_messages (message_id, consumer, processed_at)
		SELECT gen_random_uuid(), 'c', now() - interval '20 days' FROM generate_series(1, 25)`)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 5*time.Second, "old rows purged by Run", func() bool {
		return count(t, s.Pool, `SELECT count(*) FROM processed_messages`) == 0
	})
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRetentionConfigValidation(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	tests := []struct {
		name string
		cfg  idempotency.RetentionConfig
		want string // "" for valid
	}{
		{"defaults", idempotency.RetentionConfig{Pool: s.Pool}, ""},
		{"no pool", idempotency.RetentionConfig{}, "Pool: is required"},
		{"retention too short", idempotency.RetentionConfig{Pool: s.Pool, Retention: 15 * time.Minute}, "Retention: must be at least 1h"},
		{"negative retention", idempotency.RetentionConfig{Pool: s.Pool, Retention: -time.Hour}, "Retention: must be at least 1h"},
		{"batch too large", idempotency.RetentionConfig{Pool: s.Pool, BatchSize: 1_000_000}, "BatchSize"},
		{"negative batch", idempotency.RetentionConfig{Pool: s.Pool, BatchSize: -1}, "BatchSize"},
		{"negative interval", idempotency.RetentionConfig{Pool: s.Pool, Interval: -time.Second}, "Interval: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := idempotency.NewRetention(tt.cfg)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}
