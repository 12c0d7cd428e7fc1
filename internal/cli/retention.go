package cli

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/idempotency"
)

// validateRetention checks a retention flag: negative keeps rows forever,
// zero is refused (it reads as a mistake), and a positive value must be at
// least the given floor.
func validateRetention(flag string, d, least time.Duration) error {
	if d == 0 || (d > 0 && d < least) {
		return fmt.Errorf("invalid --%s: must be at least %s (negative keeps rows forever)", flag, least)
	}
	return nil
}

// consumerRetention returns a function that purges the consumers'
// processed_messages and closed dead_letters rows older than retention until
// ctx is done, or nil when retention is negative (kept forever).
func consumerRetention(pool *pgxpool.Pool, retention time.Duration, logger *slog.Logger) (func(context.Context) error, error) {
	if retention < 0 {
		return nil, nil
	}
	r, err := idempotency.NewRetention(idempotency.RetentionConfig{Pool: pool, Retention: retention, Logger: logger})
	if err != nil {
		return nil, err
	}
	return r.Run, nil
}

// keyExpiry is consumerRetention for the API's Idempotency-Keys.
func keyExpiry(pool *pgxpool.Pool, ttl time.Duration, logger *slog.Logger) (func(context.Context) error, error) {
	if ttl < 0 {
		return nil, nil
	}
	k, err := httpapi.NewKeyExpiry(httpapi.KeyExpiryConfig{Pool: pool, TTL: ttl, Logger: logger})
	if err != nil {
		return nil, err
	}
	return k.Run, nil
}
