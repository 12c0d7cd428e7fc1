package outflowtest_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/redis" // the backend this test deploys
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

type refundRequested struct {
	RefundID string `json:"refund_id"`
	Amount   int64  `json:"amount"`
}

func (refundRequested) EventType() string { return "refund.requested" }

// The pipeline runs over the broker the service deploys, here Redis
// Streams, with its crash points: a crash after the broker took the event
// delivers it twice through Redis, and the handler applies it once. An
// injected handler crash is logged as one line, without a goroutine stack.
func TestPipelineOverTheServicesBroker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	_, err := s.Pool.Exec(ctx, `CREATE TABLE refunds_seen (refund_id text PRIMARY KEY, times int NOT NULL)`)
	require.NoError(t, err)
	reg := events.NewRegistry()
	require.NoError(t, reg.Register(refundRequested{}))

	rc := testservers.Redis(t)
	prefix := testservers.UniqueName(t, rc)
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })

	h := consumer.On("refund-projection", "refunds", func(ctx context.Context, tx pgx.Tx, _ events.Event, p refundRequested) error {
		_, err := tx.Exec(ctx, `INSERT INTO refunds_seen VALUES ($1, 1)
			ON CONFLICT (refund_id) DO UPDATE SET times = refunds_seen.times + 1`, p.RefundID)
		return err
	})
	var logs outflowtest.LogBuffer
	p := outflowtest.StartPipeline(t, s.Pool, reg, []consumer.Handler{h},
		outflowtest.WithBackend(backend),
		outflowtest.WithPipelineLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))

	w, err := outbox.NewWriter(outbox.Config{})
	require.NoError(t, err)
	p.CrashAfterPublish(1)
	p.CrashInHandler(h.Name, 1)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return w.WriteTx(ctx, tx, events.Aggregate{Type: "refunds", ID: "ref_1", Version: 1}, refundRequested{RefundID: "ref_1", Amount: 500})
	}))
	p.WaitHandled()
	require.Zero(t, p.PendingCrashes())

	var times int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT times FROM refunds_seen WHERE refund_id = 'ref_1'`).Scan(&times))
	require.Equal(t, 1, times, "delivered twice by the broker, applied once")
	n, err := rc.XLen(ctx, backend.Topics("refunds")[0]).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the broker the test gave the pipeline took the event, twice (the crash after publish)")

	out := logs.String()
	require.Contains(t, out, "crash injected", "the injected handler crash is logged")
	require.NotContains(t, out, "goroutine ", "an injected crash logs no goroutine stack:\n"+out)
	require.False(t, strings.Contains(out, "panic"), "an injected crash is no panic:\n"+out)
}
