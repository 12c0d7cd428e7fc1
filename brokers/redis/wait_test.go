package redis_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

type orderEvent struct {
	N int `json:"n"`
}

func (orderEvent) EventType() string { return "order.changed" }

// shortCounter counts the messages a broker reported unpublished because
// too few replicas acknowledged them.
type shortCounter struct {
	forwarder.Broker
	short atomic.Int64
}

func (s *shortCounter) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	errs := s.Broker.Publish(ctx, msgs)
	for _, err := range errs {
		if errors.Is(err, redisstreams.ErrTooFewReplicas) {
			s.short.Add(1)
		}
	}
	return errs
}

// With WaitReplicas 1 on a primary and its replica, the forwarder marks a
// row published only once the replica has it: while the replica is down,
// rows are written to the primary again and again but stay pending (no
// attempt burnt: the broker's state, not the row's), and they are marked
// once a replica is back.
func TestWaitReplicasHoldsRowsWhileNoReplicaAcknowledges(t *testing.T) {
	t.Parallel()
	pair := testservers.StartRedisPair(t)
	b := openBackend(t, brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: pair.URL, WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond}})
	broker := &shortCounter{Broker: b.Broker()}
	schema := outflowtest.NewSchema(t)
	ctx := context.Background()
	const topic = "orders"
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	require.NoError(t, err)
	version := int64(0)
	write := func(n int) {
		for range n {
			version++
			ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: "o1", Version: version}, orderEvent{N: int(version)})
			require.NoError(t, err)
			require.NoError(t, pgx.BeginFunc(ctx, schema.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))
		}
	}
	count := func(where string) int {
		var n int
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM `+outflowtest.OutboxAsSeen+` WHERE `+where).Scan(&n))
		return n
	}
	f, err := forwarder.New(forwarder.Config{Pool: schema.Pool, Broker: broker, PollInterval: 20 * time.Millisecond,
		OutageBackoffMax: 50 * time.Millisecond, MaxAttempts: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})

	write(5)
	outflowtest.WaitFor(t, 20*time.Second, "the first rows published", func() bool { return count("published_at IS NULL") == 0 })

	pair.Replica.Kill()
	write(5)
	// The forwarder writes the new rows to the primary, again and again:
	// each time WAIT finds no replica.
	outflowtest.WaitFor(t, 20*time.Second, "publishes refused for want of a replica", func() bool { return broker.short.Load() >= 3*5 })
	require.Equal(t, 5, count("published_at IS NULL"), "rows no replica acknowledged stay pending")
	require.Zero(t, count("attempts > 0 OR parked_at IS NOT NULL"), "a missing replica burns no attempt")

	pair.Replica.Start()
	outflowtest.WaitFor(t, 30*time.Second, "the rows published once a replica is back", func() bool { return count("published_at IS NULL") == 0 })
	require.Zero(t, count("attempts > 0 OR parked_at IS NOT NULL"))
}
