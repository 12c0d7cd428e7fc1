package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// keyExpiryLock keeps the expiry to one process per schema at a time ("outk").
const keyExpiryLock = 0x6f75746b

// KeyExpiryConfig configures the expiry of stored Idempotency-Keys.
type KeyExpiryConfig struct {
	// Pool is the API's database. Required.
	Pool *pgxpool.Pool
	// TTL is how long a key and its response are kept. Defaults to 24h,
	// Stripe's choice: clients retry within seconds or minutes, and a day
	// still covers retries through an outage of the client itself. A request
	// whose key has expired runs as a new one, so the TTL must exceed the
	// longest time any client keeps retrying. At least 1m.
	TTL time.Duration
	// BatchSize bounds one delete transaction. Defaults to 1000.
	BatchSize int
	// Interval is how often Run expires keys. Defaults to 1m.
	Interval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *KeyExpiryConfig) setDefaults() {
	if c.TTL == 0 {
		c.TTL = 24 * time.Hour
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.Interval == 0 {
		c.Interval = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *KeyExpiryConfig) validate() error {
	var errs []error
	check := func(ok bool, field, want string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s", field, want))
		}
	}
	check(c.Pool != nil, "Pool", "is required")
	check(c.TTL >= time.Minute, "TTL", "must be at least 1m")
	check(c.BatchSize >= 1 && c.BatchSize <= 100_000, "BatchSize", "must be between 1 and 100000")
	check(c.Interval > 0, "Interval", "must be positive")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("httpapi key expiry config: %w", err)
	}
	return nil
}

// KeyExpiry deletes Idempotency-Keys, with their stored responses, once
// they are older than the TTL. Without it idempotency_keys grows with every
// POST that carries a key.
type KeyExpiry struct {
	cfg KeyExpiryConfig
}

// NewKeyExpiry validates cfg. Every API instance may run one: one deletes
// at a time, the others find the lock taken and wait for their next round.
func NewKeyExpiry(cfg KeyExpiryConfig) (*KeyExpiry, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &KeyExpiry{cfg: cfg}, nil
}

// Run expires keys at once and then every Interval until ctx is done; it
// returns nil then. A failed round is logged and tried again at the next.
func (k *KeyExpiry) Run(ctx context.Context) error {
	t := time.NewTicker(k.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := k.PurgeOnce(ctx); err != nil && ctx.Err() == nil {
			k.cfg.Logger.Warn("expire idempotency keys", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// expireKeysSQL deletes up to $2 keys created before $1, oldest first
// (idempotency_keys_created_idx). A key whose command is still running is
// not visible to it: its row commits with the command.
const expireKeysSQL = `
WITH scan AS (
    SELECT api_key_id, key FROM idempotency_keys WHERE created_at < $1 ORDER BY created_at LIMIT $2
), del AS (
    DELETE FROM idempotency_keys k USING scan s WHERE (k.api_key_id, k.key) = (s.api_key_id, s.key) RETURNING 1
)
SELECT (SELECT count(*) FROM scan), (SELECT count(*) FROM del)`

// PurgeOnce deletes every key older than the TTL, in transactions of at most
// BatchSize rows, and returns how many it deleted. A concurrent call (in
// this or another process) makes it return 0 at once.
func (k *KeyExpiry) PurgeOnce(ctx context.Context) (int, error) {
	cutoff := time.Now().Add(-k.cfg.TTL)
	total := 0
	for {
		scanned, deleted, acquired, err := k.batch(ctx, cutoff)
		if err != nil {
			return total, fmt.Errorf("expire idempotency keys: %w", err)
		}
		total += deleted
		if !acquired || scanned < k.cfg.BatchSize {
			if total > 0 {
				k.cfg.Logger.Info("expired idempotency keys", "keys", total, "ttl", k.cfg.TTL)
			}
			return total, nil
		}
	}
}

// batch deletes one batch in a short transaction of its own, once it holds
// the expiry lock of the current schema.
func (k *KeyExpiry) batch(ctx context.Context, cutoff time.Time) (scanned, deleted int, acquired bool, err error) {
	tx, err := k.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, 0, false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema()))`, keyExpiryLock).
		Scan(&acquired); err != nil || !acquired {
		return 0, 0, false, err
	}
	if err := tx.QueryRow(ctx, expireKeysSQL, cutoff, k.cfg.BatchSize).Scan(&scanned, &deleted); err != nil {
		return 0, 0, true, err
	}
	return scanned, deleted, true, tx.Commit(ctx)
}
