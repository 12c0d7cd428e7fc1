package consumer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/idempotency"
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
