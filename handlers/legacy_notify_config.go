package handlers

import (
	"cmp"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// NotifyConfig configures the previous release's webhook [Sender]; of it
// [NotifyMerchant] uses only Wake and Logger.
type NotifyConfig struct {
	// Client sends the webhooks. Defaults to an http.Client keeping
	// PerMerchant idle connections per host. Redirects are
	// never followed, whatever the Client says: the Sender uses a copy
	// whose CheckRedirect keeps the 3xx response (a 301/302/303 would turn
	// the POST into a GET, whose 2xx would be recorded as delivered). Its
	// Transport must be nil or an *http.Transport: the copy's dials go
	// through the address guard, and never through a proxy.
	Client *http.Client
	// AllowPrivate lets webhooks go to plain http URLs and to private,
	// loopback and link-local addresses: for local development and tests
	// only. Without it every connection is checked on the address it is
	// made to, whatever the URL's name resolved to when it was stored
	// (see [netguard.Dialer]).
	AllowPrivate bool
	// Resolver resolves webhook hosts; defaults to net.DefaultResolver.
	// Tests give a name a private address with it.
	Resolver netguard.Resolver
	// SecretKey opens the merchants' sealed webhook secrets
	// (OUTFLOW_SECRET_KEY). Plaintext secrets need none; a sealed one
	// without it (or with another key) cannot be signed with: its
	// deliveries are retried until the key is fixed or MaxAttempts.
	SecretKey *secretseal.Key
	// Timeout bounds one delivery attempt, the response's body included.
	// Defaults to 10s.
	Timeout time.Duration
	// LeaseMargin is how much longer than Timeout a delivery stays leased
	// to the sender that sends it: its request is cancelled at Timeout, so
	// another sender can take the delivery only once that request ended.
	// It covers the time to settle and the clock skew between this host
	// and PostgreSQL. Defaults to 5s.
	LeaseMargin time.Duration
	// MaxAttempts is how many times a delivery is tried before it is dead.
	// Defaults to 10.
	MaxAttempts int
	// RetryBackoff is the first retry delay; it doubles per attempt, with
	// jitter, up to RetryBackoffMax. A Retry-After header replaces it,
	// capped by RetryBackoffMax. Defaults to 1s and 5m.
	RetryBackoff, RetryBackoffMax time.Duration
	// PollInterval is how often the sender looks for due deliveries when
	// nothing wakes it (retries, and deliveries recorded by another
	// process). Defaults to 200ms.
	PollInterval time.Duration
	// Concurrency bounds the requests in flight in one Sender. Defaults
	// to 64.
	Concurrency int
	// PerMerchant bounds the requests in flight to one merchant in one
	// Sender, so a merchant that hangs holds only its own slots. Defaults
	// to 4; at most Concurrency.
	PerMerchant int
	// Wake, when set, is called by NotifyMerchant's handler after a
	// delivery it recorded has committed: set it to an in-process
	// webhooks/sender Sender's Wake so the webhook leaves in milliseconds
	// rather than at the next poll. A sender in another process finds the
	// delivery at its next poll.
	Wake func()
	// Registerer, when set, gets the Sender's metrics (see
	// [MetricWebhookAttempts] and the other Metric* names); nil: none. Two
	// Senders on one Registerer share the collectors. The Sender that
	// exports the webhook table gauges keeps one database connection open,
	// outside its pool.
	Registerer prometheus.Registerer
	// StatsInterval is how often the Sender that exports the webhook
	// table gauges refreshes them, and how often the others try to take
	// the export over. Defaults to 5s; unused without Registerer.
	StatsInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *NotifyConfig) setDefaults() {
	c.Timeout = cmp.Or(c.Timeout, 10*time.Second)
	c.LeaseMargin = cmp.Or(c.LeaseMargin, 5*time.Second)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 10)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, backoff.RetryBase)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, backoff.RetryMax)
	c.PollInterval = cmp.Or(c.PollInterval, 200*time.Millisecond)
	c.Concurrency = cmp.Or(c.Concurrency, 64)
	c.PerMerchant = cmp.Or(c.PerMerchant, min(4, c.Concurrency))
	c.StatsInterval = cmp.Or(c.StatsInterval, 5*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

func (c *NotifyConfig) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Timeout > 0, "Timeout", "must be positive")
	check(c.LeaseMargin > 0, "LeaseMargin", "must be positive")
	check(c.MaxAttempts >= 1, "MaxAttempts", "must be at least 1")
	check(c.RetryBackoff > 0, "RetryBackoff", "must be positive")
	check(c.RetryBackoffMax >= c.RetryBackoff, "RetryBackoffMax", "must be at least RetryBackoff")
	check(c.PollInterval > 0, "PollInterval", "must be positive")
	check(c.StatsInterval > 0, "StatsInterval", "must be positive")
	check(c.Concurrency >= 1 && c.Concurrency <= 10_000, "Concurrency", "must be between 1 and 10000")
	check(c.PerMerchant >= 1 && c.PerMerchant <= c.Concurrency, "PerMerchant", "must be between 1 and Concurrency")
	return errs.Err("notify config")
}
