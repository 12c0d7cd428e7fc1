package httpapi

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/retention"
)

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
	retention.Defaults(&c.BatchSize, &c.Interval, &c.Logger)
}

func (c *KeyExpiryConfig) validate() error {
	var errs configcheck.Errors
	errs.Check(c.Pool != nil, "Pool", "is required")
	errs.Check(c.TTL >= time.Minute, "TTL", "must be at least 1m")
	retention.Check(&errs, c.BatchSize, c.Interval)
	return errs.Err("httpapi key expiry config")
}

// KeyExpiry deletes Idempotency-Keys, with their stored responses, once
// they are older than the TTL. Without it idempotency_keys grows with every
// POST that carries a key.
type KeyExpiry struct {
	job retention.Job
	cfg KeyExpiryConfig
}

// NewKeyExpiry validates cfg. Every API instance may run one: one deletes
// at a time, the others find the lock taken and wait for their next round.
func NewKeyExpiry(cfg KeyExpiryConfig) (*KeyExpiry, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	k := &KeyExpiry{cfg: cfg}
	k.job = retention.Job{Name: "idempotency keys", DB: cfg.Pool, Lock: advisory.KeyExpiry, Retention: cfg.TTL,
		Logger: cfg.Logger, Tables: []retention.Table{{Name: "idempotency_keys", Batch: k.expire}}}
	return k, nil
}

// Run expires keys at once and then every Interval until ctx is done; it
// returns nil then. A failed round is logged and tried again at the next.
func (k *KeyExpiry) Run(ctx context.Context) error {
	k.job.Run(ctx, k.cfg.Interval)
	return nil
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
	n, err := k.job.Once(ctx)
	return int(n), err
}

// expire deletes one batch of keys.
func (k *KeyExpiry) expire(ctx context.Context, tx pgx.Tx, w *retention.Walk) (int64, bool, error) {
	var scanned, deleted int64
	err := tx.QueryRow(ctx, expireKeysSQL, w.Cutoff, k.cfg.BatchSize).Scan(&scanned, &deleted)
	return deleted, scanned == int64(k.cfg.BatchSize), err
}
