package idempotency

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/configcheck/configchecktest"
)

// validate reports every wrong field at once, each named.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{} // never used: validate only looks at it
	configchecktest.Run(t, "idempotency config", []configchecktest.Case[Config]{
		configchecktest.Valid("defaults", Config{Pool: pool, Consumer: "c"}),
		configchecktest.Invalid("nothing", Config{}, "Pool: is required", "Consumer: is required"),
		configchecktest.Invalid("gap", Config{Pool: pool, Consumer: "c", GapRetryDelay: time.Hour, GapTimeout: time.Minute},
			"GapRetryDelay: must be positive and at most GapTimeout"),
		configchecktest.Invalid("every number", Config{Pool: pool, Consumer: "c", MaxAttempts: -1, RetryBackoff: time.Hour, RetryBackoffMax: time.Minute,
			RetryPollInterval: -time.Second, MaxBatch: -1},
			"MaxAttempts: must be at least 1", "RetryBackoff: must be positive and at most RetryBackoffMax", "RetryPollInterval: must be positive", "MaxBatch: must be at least 1"),
	}, func(c *Config) error { c.setDefaults(); return c.validate() }, nil)
}
