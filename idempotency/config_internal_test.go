package idempotency

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// validate reports every wrong field at once, each named.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{} // never used: validate only looks at it
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings; none means valid
	}{
		{"defaults", Config{Pool: pool, Consumer: "c"}, nil},
		{"nothing", Config{}, []string{"Pool: is required", "Consumer: is required"}},
		{"gap", Config{Pool: pool, Consumer: "c", GapRetryDelay: time.Hour, GapTimeout: time.Minute},
			[]string{"GapRetryDelay: must be positive and at most GapTimeout"}},
		{"every number", Config{Pool: pool, Consumer: "c", MaxAttempts: -1, RetryBackoff: time.Hour, RetryBackoffMax: time.Minute,
			RetryPollInterval: -time.Second, MaxBatch: -1},
			[]string{"MaxAttempts: must be at least 1", "RetryBackoff: must be positive and at most RetryBackoffMax",
				"RetryPollInterval: must be positive", "MaxBatch: must be at least 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.setDefaults()
			err := cfg.validate()
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "idempotency config: ")
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}
