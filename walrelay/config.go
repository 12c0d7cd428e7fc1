package walrelay

import (
	"cmp"
	"log/slog"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/configcheck"
)

// Defaults of [Config].
const (
	DefaultSlotName          = "outflow_wal"
	DefaultPublication       = "outflow_wal"
	DefaultMaxChanges        = 30_000
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultStandbyRetry      = time.Second
	DefaultHistoryRetention  = 15 * 24 * time.Hour
)

// Config configures a [Relay]. Zero values take the documented defaults.
type Config struct {
	// Pool is the database the writers emit into, its search_path naming
	// the schema with the migrations' tables (outbox_wal_*). Required. The
	// relay holds one of its connections for as long as it reads or
	// stands by (the advisory lock is a session's), and uses one more for
	// the history and the stats: give it a pool of its own of at least 3.
	// Not through PgBouncer in transaction mode: the lock is a session's.
	Pool *pgxpool.Pool
	// Broker receives the events. Required.
	Broker forwarder.Broker

	// SlotName is the logical replication slot. Defaults to "outflow_wal".
	SlotName string
	// Publication is the empty publication pgoutput is given (it needs
	// one; none of its tables is ever published). Defaults to
	// "outflow_wal".
	Publication string
	// Prefix is the writers' outbox.Config.WALPrefix. Defaults to
	// outbox.DefaultWALPrefix.
	Prefix string
	// FailoverSlot creates the slot with PostgreSQL 17's failover = true,
	// so that standbys with sync_replication_slots keep it and a failover
	// does not lose it (docs/wal-mode.md). Before 17 the relay refuses to
	// create the slot with it, saying so: use an extension or the
	// operator's slot sync. It changes nothing for a slot that exists.
	FailoverSlot bool

	// MaxChanges bounds one read: the relay asks for up to this many
	// changes (begin, message and commit records count), and gets whole
	// transactions. Defaults to 30,000.
	MaxChanges int
	// MinPollInterval and PollInterval bound the wait between reads that
	// found nothing: it doubles from the first to the second. Defaults to
	// 5ms and 250ms.
	MinPollInterval, PollInterval time.Duration
	// HeartbeatInterval is how often an idle relay (a read found no
	// transaction) emits a heartbeat message and confirms the slot past it,
	// so that WAL written by anything else is released. Defaults to 10s.
	HeartbeatInterval time.Duration
	// StandbyRetry is how often a standby tries to become the reader.
	// Defaults to 1s.
	StandbyRetry time.Duration
	// StatsInterval is how often the slot's metrics are refreshed (every
	// instance exports them). Defaults to 5s.
	StatsInterval time.Duration

	// PublishTimeout bounds one batch's publish. Defaults to 10s.
	PublishTimeout time.Duration
	// MaxAttempts, RetryBackoff and RetryBackoffMax are the parked
	// events' retry schedule, as the forwarder's: defaults 10, 1s, 5m.
	MaxAttempts                   int
	RetryBackoff, RetryBackoffMax time.Duration
	// OutageBackoffMax caps the wait between tries while the broker is
	// unavailable. Defaults to 5s.
	OutageBackoffMax time.Duration

	// HistoryRetention is how long outbox_wal_history keeps a day's
	// partition. Defaults to 15 days. Negative writes no history (and so
	// turns the broker audit off: it repairs from the history).
	HistoryRetention time.Duration
	// AuditInterval is how often the reading relay checks, when Broker is
	// a [forwarder.Auditor], the receipts of what the broker acknowledged
	// against the broker, and publishes again from the history what it
	// lost (see docs/broker-loss.md). Defaults to 20s; negative disables
	// the audit and the receipts.
	AuditInterval time.Duration

	// ShutdownTimeout bounds how long Run waits for the batch in flight
	// once its context is done. Defaults to 15s.
	ShutdownTimeout time.Duration

	// Registerer receives the metrics. Defaults to none.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	c.SlotName = cmp.Or(c.SlotName, DefaultSlotName)
	c.Publication = cmp.Or(c.Publication, DefaultPublication)
	c.Prefix = cmp.Or(c.Prefix, outbox.DefaultWALPrefix)
	c.MaxChanges = cmp.Or(c.MaxChanges, DefaultMaxChanges)
	c.PollInterval = cmp.Or(c.PollInterval, 250*time.Millisecond)
	c.MinPollInterval = cmp.Or(c.MinPollInterval, min(5*time.Millisecond, c.PollInterval))
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.StandbyRetry = cmp.Or(c.StandbyRetry, DefaultStandbyRetry)
	c.StatsInterval = cmp.Or(c.StatsInterval, 5*time.Second)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, forwarder.DefaultPublishTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, forwarder.DefaultMaxAttempts)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, backoff.RetryBase)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, backoff.RetryMax)
	c.OutageBackoffMax = cmp.Or(c.OutageBackoffMax, backoff.ReconnectMax)
	c.HistoryRetention = cmp.Or(c.HistoryRetention, DefaultHistoryRetention)
	c.AuditInterval = cmp.Or(c.AuditInterval, 20*time.Second)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 15*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// slotNameRE is what PostgreSQL accepts as a slot name.
var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkSlot checks the slot and publication names of a Config or a
// RecoverConfig.
func checkSlot(errs *configcheck.Errors, slot, publication string) {
	errs.Check(slotNameRE.MatchString(slot), "SlotName", "must be 1 to 63 lower-case letters, digits or _")
	errs.Check(identRE.MatchString(publication), "Publication", "must be a lower-case SQL identifier")
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Pool != nil, "Pool", "is required")
	check(c.Broker != nil, "Broker", "is required")
	checkSlot(&errs, c.SlotName, c.Publication)
	check(c.Prefix != "", "Prefix", "must not be empty")
	check(c.MaxChanges >= 3 && c.MaxChanges <= 1_000_000, "MaxChanges", "must be between 3 and 1000000")
	check(c.PollInterval > 0 && c.MinPollInterval > 0 && c.MinPollInterval <= c.PollInterval, "MinPollInterval", "must be positive and at most PollInterval")
	check(c.HeartbeatInterval >= 10*time.Millisecond, "HeartbeatInterval", "must be at least 10ms")
	check(c.StandbyRetry >= 10*time.Millisecond, "StandbyRetry", "must be at least 10ms")
	check(c.StatsInterval >= 10*time.Millisecond, "StatsInterval", "must be at least 10ms")
	check(c.PublishTimeout > 0, "PublishTimeout", "must be positive")
	check(c.MaxAttempts >= 1, "MaxAttempts", "must be at least 1")
	check(c.RetryBackoff > 0 && c.RetryBackoffMax >= c.RetryBackoff, "RetryBackoff", "must be positive and at most RetryBackoffMax")
	check(c.OutageBackoffMax > 0, "OutageBackoffMax", "must be positive")
	check(c.HistoryRetention < 0 || c.HistoryRetention >= time.Hour, "HistoryRetention", "must be at least 1h, or negative to keep no history")
	check(c.ShutdownTimeout > 0, "ShutdownTimeout", "must be positive")
	check(c.AuditInterval < 0 || c.AuditInterval >= 10*time.Millisecond, "AuditInterval", "must be at least 10ms, or negative to disable the audit")
	return errs.Err("walrelay config")
}
