package sender

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// Defaults of [Config]'s fields left zero.
const (
	DefaultTimeout            = 10 * time.Second
	DefaultLeaseMargin        = 5 * time.Second
	DefaultJitter             = 0.2
	DefaultCircuitFailures    = 5
	DefaultCircuitCooldown    = time.Minute
	DefaultCircuitCooldownMax = time.Hour
	DefaultDisableAfter       = 5 * 24 * time.Hour
	DefaultPollInterval       = 200 * time.Millisecond
	DefaultConcurrency        = 64
	DefaultPerEndpoint        = 4
	DefaultMaxResponseBody    = 1 << 10
)

// DefaultSchedule returns the delays after each failed attempt: about three
// days in all, after which a delivery is failed.
func DefaultSchedule() []time.Duration {
	return []time.Duration{5 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour,
		5 * time.Hour, 10 * time.Hour, 14 * time.Hour, 20 * time.Hour, 20 * time.Hour}
}

// Config configures a [Sender]. Zero fields take the Default* values.
type Config struct {
	// Client sends the webhooks. Redirects are never followed, whatever
	// it says: the Sender uses a copy whose CheckRedirect keeps the 3xx (a
	// 301/302/303 would turn the POST into a GET whose 2xx would count as
	// delivered). Its Transport must be nil or an *http.Transport: the
	// copy dials through the address guard, and never through a proxy (a
	// proxy resolves the name out of the guard's sight).
	Client *http.Client
	// AllowPrivate lets webhooks go to plain http URLs and private,
	// loopback and link-local addresses: for development and tests only.
	AllowPrivate bool
	// Resolver resolves endpoint hosts; defaults to net.DefaultResolver.
	Resolver netguard.Resolver
	// SecretKey opens the endpoints' sealed secrets (sealed with the
	// endpoint id as associated data). Plaintext secrets need none; a
	// sealed one without the right key cannot be signed with and is
	// retried on the schedule meanwhile: the operator's to fix.
	SecretKey *secretseal.Key
	// Render makes each endpoint's body, in its api_version. Defaults to
	// [webhooks.DefaultRenderer].
	Render webhooks.Renderer
	// Timeout bounds one attempt, the response's body included.
	Timeout time.Duration
	// LeaseMargin is how much longer than Timeout a delivery stays leased:
	// another Sender can take it only once this one's request has ended.
	// It covers settling and the clock skew with PostgreSQL.
	LeaseMargin time.Duration
	// Schedule is the delay after each failed attempt (the first entry
	// after the first attempt); after the last one the delivery is
	// failed. A Retry-After replaces the step, capped at the longest step.
	Schedule []time.Duration
	// Jitter spreads each step by ±Jitter (0.2: ×[0.8, 1.2]), so that
	// deliveries that failed together do not come back together. Zero
	// is the default; a negative value means none.
	Jitter float64
	// CircuitFailures consecutive failed attempts of an endpoint open its
	// circuit for CircuitCooldown, doubling per failed probe up to
	// CircuitCooldownMax.
	CircuitFailures                     int
	CircuitCooldown, CircuitCooldownMax time.Duration
	// DisableAfter: an endpoint failing without a success for longer is
	// disabled at its next failed attempt.
	DisableAfter time.Duration
	// PollInterval is how often the Sender looks for due deliveries when
	// nothing wakes it.
	PollInterval time.Duration
	// Concurrency bounds the requests in flight in one Sender, those moved
	// to the suspect lane for running longer than SlowAfter aside.
	Concurrency int
	// PerEndpoint bounds the requests in flight to one endpoint in one
	// Sender (at most Concurrency).
	PerEndpoint int
	// SuspectConcurrency bounds the requests in flight, all together, to
	// endpoints whose last attempt failed: slow or failing endpoints
	// cannot take the healthy ones' slots. Defaults to Concurrency/4, at
	// least 1.
	SuspectConcurrency int
	// SlowAfter: a request running longer moves to the suspect lane,
	// freeing its slot, and its endpoint counts as suspect in this Sender
	// until its slow requests end; when less than a quarter of the slots
	// are free, a request running longer than SlowAfter/10 does. Defaults
	// to Timeout/10; Timeout turns it off.
	SlowAfter time.Duration
	// MaxResponseBody is how many bytes of a response's body an attempt
	// records (valid UTF-8, secrets masked).
	MaxResponseBody int
	// Registerer, when set, gets the Sender's metrics (Metric* names).
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default(). Nothing the Sender logs holds a
	// secret or a URL's query.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.LeaseMargin = cmp.Or(c.LeaseMargin, DefaultLeaseMargin)
	c.CircuitCooldown = cmp.Or(c.CircuitCooldown, DefaultCircuitCooldown)
	c.CircuitCooldownMax = cmp.Or(c.CircuitCooldownMax, max(DefaultCircuitCooldownMax, c.CircuitCooldown))
	c.DisableAfter = cmp.Or(c.DisableAfter, DefaultDisableAfter)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	if c.Render == nil {
		c.Render = webhooks.DefaultRenderer
	}
	if c.Schedule == nil {
		c.Schedule = DefaultSchedule()
	}
	switch {
	case c.Jitter == 0:
		c.Jitter = DefaultJitter
	case c.Jitter < 0:
		c.Jitter = 0
	}
	c.CircuitFailures = cmp.Or(c.CircuitFailures, DefaultCircuitFailures)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.PerEndpoint = cmp.Or(c.PerEndpoint, min(DefaultPerEndpoint, c.Concurrency))
	c.SuspectConcurrency = cmp.Or(c.SuspectConcurrency, max(1, c.Concurrency/4))
	c.SlowAfter = cmp.Or(c.SlowAfter, max(c.Timeout/10, time.Millisecond))
	c.MaxResponseBody = cmp.Or(c.MaxResponseBody, DefaultMaxResponseBody)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Timeout > 0, "Timeout", "must be positive")
	check(c.LeaseMargin > 0, "LeaseMargin", "must be positive")
	check(len(c.Schedule) > 0 && len(c.Schedule) <= 100, "Schedule", "must have between 1 and 100 steps")
	for i, d := range c.Schedule {
		check(d > 0, fmt.Sprintf("Schedule[%d]", i), "must be positive")
	}
	check(c.Jitter < 1, "Jitter", "must be less than 1")
	check(c.CircuitFailures >= 1, "CircuitFailures", "must be at least 1")
	check(c.CircuitCooldown > 0, "CircuitCooldown", "must be positive")
	check(c.CircuitCooldownMax >= c.CircuitCooldown, "CircuitCooldownMax", "must be at least CircuitCooldown")
	check(c.DisableAfter > 0, "DisableAfter", "must be positive")
	check(c.PollInterval > 0, "PollInterval", "must be positive")
	check(c.Concurrency >= 1 && c.Concurrency <= 10_000, "Concurrency", "must be between 1 and 10000")
	check(c.PerEndpoint >= 1 && c.PerEndpoint <= c.Concurrency, "PerEndpoint", "must be between 1 and Concurrency")
	check(c.SuspectConcurrency >= 1 && c.SuspectConcurrency <= c.Concurrency, "SuspectConcurrency",
		"must be between 1 and Concurrency")
	check(c.SlowAfter > 0 && c.SlowAfter <= c.Timeout, "SlowAfter", "must be positive and at most Timeout")
	check(c.MaxResponseBody >= 1 && c.MaxResponseBody <= 64<<10, "MaxResponseBody", "must be between 1 and 65536")
	return errs.Err("webhook sender config")
}

// longest is the schedule's longest step: the cap on a Retry-After.
func (c *Config) longest() time.Duration {
	var m time.Duration
	for _, d := range c.Schedule {
		m = max(m, d)
	}
	return m
}
