package cli

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
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

// consumerRetention returns a function that, every minute until ctx is
// done, purges what the consumers keep past its use once it is older than
// retention: closed dead_letters rows and processed_messages, whole (see
// idempotency.Retention), and settled webhook deliveries with their
// attempts, and the messages none of them is left for (see deliveries.Purge). It returns nil when retention is
// negative (kept forever).
func consumerRetention(pool *pgxpool.Pool, retention time.Duration, logger *slog.Logger) (func(context.Context) error, error) {
	if retention < 0 {
		return nil, nil
	}
	r, err := idempotency.NewRetention(idempotency.RetentionConfig{Pool: pool, Retention: retention, Logger: logger})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		var wg sync.WaitGroup
		wg.Go(func() { _ = r.Run(ctx) })
		poll.Every(ctx, time.Minute, func(ctx context.Context) error {
			n, messages, err := deliveries.Purge(ctx, pool, time.Now().Add(-retention), 1000)
			if n > 0 {
				logger.Info("purged webhook deliveries", "deliveries", n, "messages", messages, "retention", retention)
			}
			return err
		}, poll.Warn(logger, "purge webhook deliveries"))
		wg.Wait()
		return nil
	}, nil
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
