package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/configcheck/configchecktest"
)

// A handler's idempotency settings override the worker's field by field.
func TestMergeIdempotency(t *testing.T) {
	t.Parallel()
	cut := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	base := idempotency.Config{MaxAttempts: 5, MaxBatch: 50, GapTimeout: time.Minute, RetryBackoff: time.Second}
	tests := []struct {
		name string
		over idempotency.Config
		want idempotency.Config
	}{
		{"nothing set: the worker's", idempotency.Config{}, base},
		{"one field", idempotency.Config{MaxAttempts: 1},
			idempotency.Config{MaxAttempts: 1, MaxBatch: 50, GapTimeout: time.Minute, RetryBackoff: time.Second}},
		{"every field", idempotency.Config{Ordering: idempotency.LatestWins, GapRetryDelay: 2 * time.Second, GapTimeout: time.Hour,
			MaxAttempts: 2, RetryBackoff: 3 * time.Second, RetryBackoffMax: time.Hour, RetryPollInterval: time.Second, MaxBatch: 1, BaselineBefore: cut},
			idempotency.Config{Ordering: idempotency.LatestWins, GapRetryDelay: 2 * time.Second, GapTimeout: time.Hour,
				MaxAttempts: 2, RetryBackoff: 3 * time.Second, RetryBackoffMax: time.Hour, RetryPollInterval: time.Second, MaxBatch: 1, BaselineBefore: cut}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, mergeIdempotency(base, tt.over))
		})
	}
}

// unopenedBackend is a Backend never called: these tests stop before the
// broker.
type unopenedBackend struct{ brokers.Backend }

// A handler's effective settings: its own where set, the worker's
// otherwise; its ordering is its own whatever the worker's.
func TestHandlerSettings(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/outflow_test") // connects on first use: never here
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	w, err := NewWorker(WorkerConfig{Pool: pool, Broker: unopenedBackend{}, Registry: events.NewRegistry(),
		BatchSize: 50, ClaimIdle: time.Minute, Idempotency: idempotency.Config{Ordering: idempotency.LatestWins, MaxAttempts: 4}})
	require.NoError(t, err)
	cut := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		h         Handler
		batch     int
		claimIdle time.Duration
		ordering  idempotency.Ordering
		attempts  int
		baseline  time.Time
	}{
		{"the worker's", Handler{}, 50, time.Minute, idempotency.Strict, 4, time.Time{}},
		{"own batch and claim", Handler{BatchSize: 1, ClaimIdle: time.Second}, 1, time.Second, idempotency.Strict, 4, time.Time{}},
		{"own ordering", Handler{Ordering: idempotency.LatestWins}, 50, time.Minute, idempotency.LatestWins, 4, time.Time{}},
		{"ordering in Idempotency", Handler{Idempotency: idempotency.Config{Ordering: idempotency.LatestWins, MaxAttempts: 1}},
			50, time.Minute, idempotency.LatestWins, 1, time.Time{}},
		{"baseline either way", Handler{Idempotency: idempotency.Config{BaselineBefore: cut}}, 50, time.Minute, idempotency.Strict, 4, cut},
		{"baseline field wins", Handler{BaselineBefore: cut, Idempotency: idempotency.Config{BaselineBefore: cut.Add(-time.Hour)}},
			50, time.Minute, idempotency.Strict, 4, cut},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.h
			h.Name = "h"
			s, err := w.settings(h)
			require.NoError(t, err)
			require.Equal(t, tt.batch, s.BatchSize)
			require.Equal(t, tt.claimIdle, s.ClaimIdle)
			require.Equal(t, tt.ordering, s.Idempotency.Ordering)
			require.Equal(t, tt.attempts, s.Idempotency.MaxAttempts)
			require.Equal(t, tt.baseline, s.Idempotency.BaselineBefore)
			require.Equal(t, "h", s.Idempotency.Consumer)
			require.Same(t, pool, s.Idempotency.Pool)
			require.NotNil(t, s.Idempotency.Logger)
		})
	}
}

// NewWorker reports every wrong field at once, each named, and fills the
// defaults.
func TestWorkerConfigValidate(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/outflow_test") // connects on first use: never here
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	valid := WorkerConfig{Pool: pool, Broker: unopenedBackend{}, Registry: events.NewRegistry()}
	with := func(change func(c *WorkerConfig)) WorkerConfig {
		c := valid
		change(&c)
		return c
	}
	configchecktest.Run(t, "worker config", []configchecktest.Case[WorkerConfig]{
		configchecktest.Valid("defaults", valid),
		configchecktest.Invalid("nothing", WorkerConfig{}, "Pool: is required", "Broker: is required", "Registry: is required"),
		configchecktest.Invalid("negatives and nils", with(func(c *WorkerConfig) {
			c.BatchSize, c.ClaimIdle, c.LagInterval = -1, -1, -1
			c.Middleware, c.Plugins = []message.HandlerMiddleware{nil}, []message.RouterPlugin{nil}
		}), "BatchSize: must be at least 1", "ClaimIdle: must be positive", "LagInterval: must be positive",
			"Middleware: holds a nil middleware", "Plugins: holds a nil plugin"),
		configchecktest.Invalid("idempotency", with(func(c *WorkerConfig) { c.Idempotency.MaxAttempts = -1 }),
			"Idempotency: idempotency config: MaxAttempts: must be at least 1"),
	}, func(c *WorkerConfig) error {
		// NewWorker, not setDefaults and validate alone: it is what a
		// user calls, and it fills InstanceID.
		w, err := NewWorker(*c)
		if err == nil {
			*c = w.cfg
		}
		return err
	}, func(t *testing.T, c WorkerConfig) {
		require.Equal(t, brokers.DefaultClaimIdle, c.ClaimIdle)
		require.NotEmpty(t, c.InstanceID)
	})
}
