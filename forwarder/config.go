package forwarder

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/instanceid"
)

// The defaults of the publishing schedule, shared with the WAL relay
// (package walrelay), which parks and retries on the forwarder's schedule.
const (
	DefaultPublishTimeout = 10 * time.Second
	DefaultMaxAttempts    = 10
)

// Config configures a [Forwarder]. Zero values take the documented defaults.
type Config struct {
	// Pool is the database holding the outbox. Required. Give the forwarder
	// a pool of its own: it uses one connection per claim in flight and one
	// for its lease, stats and purge ticks. It holds no session state, so
	// the pool may go through PgBouncer in transaction pooling mode (with
	// pgx's default_query_exec_mode=exec or simple_protocol, see
	// docs/forwarder.md).
	Pool *pgxpool.Pool
	// Broker receives the rows. Required.
	Broker Broker
	// MessagingSystem is the messaging.system attribute of the publish
	// spans: the backend's kind (redis, nats, kafka...). Defaults to
	// "outflow".
	MessagingSystem string

	// InstanceID names this instance in the lease table. Defaults to
	// host-pid-random.
	InstanceID string
	// BatchSize is how many rows one claim takes. Defaults to 500.
	BatchSize int
	// MinPollInterval is the first wait of a forwarder that found no row:
	// each look that finds none doubles the wait, up to PollInterval, and
	// any row found (or a [Forwarder.Wake]) brings it back here. It bounds
	// how long a row committed just after a busy spell waits. Defaults to
	// 2ms (PollInterval if smaller).
	MinPollInterval time.Duration
	// PollInterval is the longest wait of an idle forwarder between two
	// looks for rows (an index-only probe, the claim only when it finds
	// something): the most a row committed after a quiet spell waits when
	// nothing calls Wake. Defaults to 250ms.
	PollInterval time.Duration
	// Partitions is how many partitions the rows are spread over by a hash
	// of their aggregate id; each is forwarded by one instance at a time, so
	// it bounds useful instances. Every instance must use the same number.
	// Defaults to 16.
	Partitions int
	// TakeoverAfter is how long a partition's lease lasts without renewal:
	// a dead instance's partitions move to the others after at most this
	// plus LeaseRenewInterval. Defaults to 10s.
	TakeoverAfter time.Duration
	// LeaseRenewInterval is how often leases are renewed and rebalanced.
	// Defaults to TakeoverAfter/5.
	LeaseRenewInterval time.Duration
	// ClaimLockTimeout bounds how long a claim waits for rows locked by an
	// instance that lost its lease but has not finished its batch. Defaults
	// to 5s.
	ClaimLockTimeout time.Duration
	// PublishTimeout bounds one batch's publish. Defaults to 10s.
	PublishTimeout time.Duration

	// MaxAttempts is how many times a row that fails for its own reason is
	// tried before it is parked. Defaults to 10.
	MaxAttempts int
	// RetryBackoff is the first retry delay of a failing row; it doubles per
	// attempt up to RetryBackoffMax, with full jitter. Defaults to 1s and 5m.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// OutageBackoffMax caps the wait between tries while the broker is
	// unavailable. Defaults to 5s.
	OutageBackoffMax time.Duration
	// MaxPayloadBytes fails, without sending, a row whose payload is
	// larger (retried, then parked, as any failing row). A broker with a
	// limit of its own ([PayloadLimiter]) fails the rows over it the same
	// way, when it is the smaller. Defaults to 1 MiB.
	MaxPayloadBytes int

	// Retention is how long published rows are kept. Defaults to 15 days.
	// Negative disables the purge.
	Retention time.Duration
	// PurgeInterval is how often the purge runs. Defaults to 1m.
	PurgeInterval time.Duration
	// PurgeBatchSize bounds one purge transaction of the rows that landed
	// in outbox_default (see Purge). Defaults to 1000.
	PurgeBatchSize int
	// HistoryPartitionSize is how many ids each range partition of the
	// outbox table holds (not to be confused with Partitions, the lease
	// partitions): retention drops a partition whole once its newest row
	// is older than Retention, so a partition should hold a fraction of a
	// retention's rows. The purge loop keeps two of them ahead of the ids.
	// Defaults to 10,000,000: at 100 events/s a partition every 28 hours,
	// at 1,000/s one every 3 hours (some 130 over 15 days).
	HistoryPartitionSize int64

	// AuditInterval is how often the holder of partition 0 checks, with a
	// Broker that is an [Auditor], the receipts of what it published and
	// no consumer has settled yet, and publishes again the rows whose
	// messages the broker lost: a loss is repaired within about
	// AuditInterval plus one publish. Defaults to 20s. Negative disables
	// the audit (and the receipts); a Broker that is no Auditor is never
	// audited.
	AuditInterval time.Duration

	// ShutdownTimeout bounds how long Run, once its context is done, waits
	// for the batch in flight before it releases its leases. Defaults to 15s.
	ShutdownTimeout time.Duration

	// Registerer receives the forwarder's metrics. Defaults to none.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.InstanceID == "" {
		c.InstanceID = instanceid.New()
	}
	c.BatchSize = cmp.Or(c.BatchSize, 500)
	c.PollInterval = cmp.Or(c.PollInterval, 250*time.Millisecond)
	c.MinPollInterval = cmp.Or(c.MinPollInterval, min(2*time.Millisecond, c.PollInterval))
	c.Partitions = cmp.Or(c.Partitions, 16)
	c.TakeoverAfter = cmp.Or(c.TakeoverAfter, 10*time.Second)
	c.LeaseRenewInterval = cmp.Or(c.LeaseRenewInterval, c.TakeoverAfter/5)
	c.ClaimLockTimeout = cmp.Or(c.ClaimLockTimeout, 5*time.Second)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, backoff.RetryBase)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, backoff.RetryMax)
	c.OutageBackoffMax = cmp.Or(c.OutageBackoffMax, backoff.ReconnectMax)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, 1<<20)
	c.Retention = cmp.Or(c.Retention, 15*24*time.Hour)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, time.Minute)
	c.PurgeBatchSize = cmp.Or(c.PurgeBatchSize, 1000)
	if c.HistoryPartitionSize == 0 {
		c.HistoryPartitionSize = 10_000_000
	}
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 15*time.Second)
	c.AuditInterval = cmp.Or(c.AuditInterval, 20*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Pool != nil, "Pool", "is required")
	check(c.Broker != nil, "Broker", "is required")
	check(c.BatchSize >= 1 && c.BatchSize <= 10_000, "BatchSize", "must be between 1 and 10000")
	check(c.MinPollInterval > 0 && c.MinPollInterval <= c.PollInterval, "MinPollInterval", "must be positive and at most PollInterval")
	check(c.PollInterval > 0, "PollInterval", "must be positive")
	check(c.Partitions >= 1 && c.Partitions <= 4096, "Partitions", "must be between 1 and 4096")
	check(c.TakeoverAfter >= time.Second, "TakeoverAfter", "must be at least 1s")
	check(c.LeaseRenewInterval > 0 && c.LeaseRenewInterval <= c.TakeoverAfter/2, "LeaseRenewInterval", "must be positive and at most half of TakeoverAfter")
	check(c.ClaimLockTimeout > 0, "ClaimLockTimeout", "must be positive")
	check(c.PublishTimeout > 0, "PublishTimeout", "must be positive")
	check(c.MaxAttempts >= 1, "MaxAttempts", "must be at least 1")
	check(c.RetryBackoff > 0 && c.RetryBackoffMax >= c.RetryBackoff, "RetryBackoff", "must be positive and at most RetryBackoffMax")
	check(c.OutageBackoffMax > 0, "OutageBackoffMax", "must be positive")
	check(c.MaxPayloadBytes > 0, "MaxPayloadBytes", "must be positive")
	check(c.PurgeInterval > 0, "PurgeInterval", "must be positive")
	check(c.PurgeBatchSize >= 1, "PurgeBatchSize", "must be at least 1")
	check(c.HistoryPartitionSize >= 1, "HistoryPartitionSize", "must be at least 1")
	check(c.ShutdownTimeout > 0, "ShutdownTimeout", "must be positive")
	check(c.AuditInterval < 0 || c.AuditInterval >= 10*time.Millisecond, "AuditInterval", "must be at least 10ms, or negative to disable the audit")
	return errs.Err("forwarder config")
}
