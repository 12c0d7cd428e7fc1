package endpoints

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

// Defaults of [Config].
const (
	// DefaultSecretGrace is how long a rotated-out secret still signs when
	// Config.SecretGrace is zero.
	DefaultSecretGrace = 24 * time.Hour
	// DefaultMaxPerAccount is Config.MaxPerAccount's default.
	DefaultMaxPerAccount = 20
	// ListLimit bounds [Store.List] and Config.MaxPerAccount.
	ListLimit = 1000
)

// NoGrace, as Config.SecretGrace, makes a rotation replace the secret at
// once: the previous one signs nothing more.
const NoGrace time.Duration = -1

// ErrTooMany is returned by Create when the account already has
// Config.MaxPerAccount endpoints.
var ErrTooMany = errors.New("the account has as many webhook endpoints as it may")

// Config configures a [Store].
type Config struct {
	// SecretKey seals the signing secrets at rest, with the endpoint's id
	// as associated data. nil: they are stored in plaintext (see
	// [SealSecrets] to seal them once a key is set).
	SecretKey *secretseal.Key
	// AllowPrivate accepts http URLs and URLs that point at private,
	// loopback or link-local addresses (development and tests only); see
	// [netguard.Policy.CheckURL].
	AllowPrivate bool
	// SecretGrace is how long a rotated-out secret still signs, so that the
	// account can switch without losing a webhook: 0 is
	// [DefaultSecretGrace], a negative value ([NoGrace]) none.
	SecretGrace time.Duration
	// APIVersion is the payload version new endpoints are pinned to: the
	// service's current one. Empty for a service that has none.
	APIVersion string
	// MaxPerAccount bounds an account's endpoints: 0 is
	// [DefaultMaxPerAccount]; at most [ListLimit].
	MaxPerAccount int
	// Now is the clock the rows' timestamps are written with; nil is
	// time.Now. For tests.
	Now func() time.Time
}

// Store manages endpoints. Its methods run on the caller's [webhooks.DB]
// (a pool, or the transaction of the command they are part of) and take
// the account the caller acts for: an endpoint of another account is
// [webhooks.ErrNotFound].
type Store struct {
	key        *secretseal.Key
	policy     netguard.Policy
	grace      time.Duration // 0: none
	apiVersion string
	max        int
	now        func() time.Time
}

// New returns a Store.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// NoGrace (negative) is a grace of 0.
	return &Store{key: cfg.SecretKey, policy: netguard.Policy{AllowPrivate: cfg.AllowPrivate}, grace: max(cfg.SecretGrace, 0),
		apiVersion: cfg.APIVersion, max: cfg.MaxPerAccount, now: cfg.Now}, nil
}

func (c *Config) setDefaults() {
	c.SecretGrace = cmp.Or(c.SecretGrace, DefaultSecretGrace)
	c.MaxPerAccount = cmp.Or(c.MaxPerAccount, DefaultMaxPerAccount)
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	errs.Check(c.MaxPerAccount >= 1 && c.MaxPerAccount <= ListLimit, "MaxPerAccount",
		fmt.Sprintf("must be from 0 (the default, %d) to %d, not %d", DefaultMaxPerAccount, ListLimit, c.MaxPerAccount))
	errs.Check(len(c.APIVersion) <= 100, "APIVersion", "must be at most 100 bytes")
	return errs.Err("endpoints config")
}

// MaxPerAccount is how many endpoints an account may have.
func (s *Store) MaxPerAccount() int { return s.max }

// Endpoint is an endpoint as the account sees it: never its secret.
type Endpoint struct {
	ID          string   `json:"id"`
	AccountID   string   `json:"account_id"`
	URL         string   `json:"url"`
	Description string   `json:"description"`
	EventTypes  []string `json:"event_types"`
	APIVersion  string   `json:"api_version"`
	// RateLimit is requests per second at most; nil: no limit but the
	// sender's.
	RateLimit *int `json:"rate_limit"`
	Disabled  bool `json:"disabled"`
	// DisabledReason is "manual" or "failing" when Disabled.
	DisabledReason string     `json:"disabled_reason,omitempty"`
	DisabledAt     *time.Time `json:"disabled_at"`
	// FailingSince is when the current run of failed attempts began.
	FailingSince *time.Time `json:"failing_since"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

// NewEndpoint is an endpoint to create (not "New", which is the constructor).
type NewEndpoint struct {
	URL         string `json:"url"`
	Description string `json:"description"`
	// EventTypes are the types the endpoint wants: exact names or prefixes
	// ending in ".*"; empty or nil: every type.
	EventTypes []string `json:"event_types"`
	RateLimit  *int     `json:"rate_limit"`
}

// Created is a new endpoint and its signing secret, shown this once.
type Created struct {
	Endpoint
	Secret string `json:"secret"`
}

// Update changes the fields that are set. A nil field is left as it is;
// RateLimit nil leaves the limit, ClearRateLimit removes it (an API maps
// JSON null to it).
type Update struct {
	URL            *string
	Description    *string
	EventTypes     *[]string
	RateLimit      *int
	ClearRateLimit bool
}

// Rotated is the answer to a rotation: the new secret, shown once, and
// until when the previous one still signs (nil: it signs no more).
type Rotated struct {
	EndpointID              string     `json:"endpoint_id"`
	Secret                  string     `json:"secret"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

// The account-scoped statements all name the endpoint by id and account:
// another account's endpoint is not found, as an unknown one.
const columns = `id::text, account_id, url, description, event_types, api_version, rate_limit,
	disabled_reason, disabled_at, failing_since, created_at, updated_at`

func scan(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	var reason *string
	if err := row.Scan(&e.ID, &e.AccountID, &e.URL, &e.Description, &e.EventTypes, &e.APIVersion, &e.RateLimit,
		&reason, &e.DisabledAt, &e.FailingSince, &e.CreatedAt, &e.UpdatedAt); err != nil {
		return Endpoint{}, err
	}
	if reason != nil {
		e.Disabled, e.DisabledReason = true, *reason
	}
	if e.EventTypes == nil {
		e.EventTypes = []string{}
	}
	// pgx reads timestamptz in time.Local: the API answers in UTC.
	e.CreatedAt, e.UpdatedAt = e.CreatedAt.UTC(), e.UpdatedAt.UTC()
	for _, t := range []**time.Time{&e.DisabledAt, &e.FailingSince} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
	return e, nil
}

// endpointID returns id in canonical form, and false for a string that is
// no endpoint id: it is then not found rather than a database error.
func endpointID(id string) (string, bool) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		return "", false
	}
	return u.String(), true
}

// notFound wraps err: pgx.ErrNoRows becomes webhooks.ErrNotFound.
func notFound(what, id string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s %s: %w", what, id, webhooks.ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", what, id, err)
}

// sealed is secret as the table keeps it for endpoint id: sealed when the
// store has a key, else plaintext.
func (s *Store) sealed(secret, id string) (string, error) {
	if s.key == nil {
		return secret, nil
	}
	out, err := s.key.Seal(secret, id)
	if err != nil {
		return "", fmt.Errorf("seal webhook secret: %w", err)
	}
	return out, nil
}

// inTx runs fn in a transaction of db (a savepoint when db is one).
func inTx(ctx context.Context, db webhooks.DB, fn func(pgx.Tx) error) error {
	b, ok := db.(advisory.Beginner)
	if !ok {
		return fmt.Errorf("webhook endpoints: %T cannot begin a transaction", db)
	}
	return pgx.BeginFunc(ctx, b, fn)
}

// Create makes an endpoint for account, pinned to Config.APIVersion, with
// a new signing secret returned this once. It refuses a bad field with a
// *webhooks.ValidationError and an account that has MaxPerAccount
// endpoints with [ErrTooMany].
func (s *Store) Create(ctx context.Context, db webhooks.DB, account string, in NewEndpoint) (Created, error) {
	if err := s.validateNew(in); err != nil {
		return Created{}, err
	}
	if account == "" {
		return Created{}, errors.New("create webhook endpoint: account is required")
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Created{}, fmt.Errorf("create webhook endpoint: %w", err)
	}
	secret, err := signing.NewSecret()
	if err != nil {
		return Created{}, err
	}
	stored, err := s.sealed(secret, id.String())
	if err != nil {
		return Created{}, err
	}
	types := in.EventTypes
	if types == nil {
		types = []string{}
	}
	now := s.now().UTC()
	var out Created
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		// The count holds while the lock is: a concurrent Create waits
		// for this transaction, then counts this endpoint.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema() || '/' || $2))`,
			advisory.EndpointsPerAccount, account); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE account_id = $1`, account).Scan(&n); err != nil {
			return err
		}
		if n >= s.max {
			return fmt.Errorf("%w (%d)", ErrTooMany, s.max)
		}
		e, err := scan(tx.QueryRow(ctx, `
			INSERT INTO webhook_endpoints (id, account_id, url, description, event_types, api_version, rate_limit,
			                               secret, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
			RETURNING `+columns, id, account, in.URL, in.Description, types, s.apiVersion, in.RateLimit, stored, now))
		out = Created{Endpoint: e, Secret: secret}
		return err
	})
	if err != nil {
		return Created{}, fmt.Errorf("create webhook endpoint: %w", err)
	}
	return out, nil
}

// Get returns account's endpoint id.
func (s *Store) Get(ctx context.Context, db webhooks.DB, account, id string) (Endpoint, error) {
	key, ok := endpointID(id)
	if !ok {
		return Endpoint{}, notFound("webhook endpoint", id, pgx.ErrNoRows)
	}
	e, err := scan(db.QueryRow(ctx, `SELECT `+columns+` FROM webhook_endpoints WHERE id = $1 AND account_id = $2`,
		key, account))
	if err != nil {
		return Endpoint{}, notFound("webhook endpoint", id, err)
	}
	return e, nil
}

// List returns account's endpoints, oldest first, at most [ListLimit]
// (Create keeps an account to MaxPerAccount, which is no more).
func (s *Store) List(ctx context.Context, db webhooks.DB, account string) ([]Endpoint, error) {
	rows, err := db.Query(ctx, `SELECT `+columns+` FROM webhook_endpoints WHERE account_id = $1
		ORDER BY created_at, id LIMIT $2`, account, ListLimit)
	if err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	defer rows.Close()
	out := []Endpoint{}
	for rows.Next() {
		e, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("list webhook endpoints: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	return out, nil
}

// Update changes the fields in that are set and returns the endpoint. An
// update that sets nothing returns it unchanged.
func (s *Store) Update(ctx context.Context, db webhooks.DB, account, id string, in Update) (Endpoint, error) {
	if err := s.validateUpdate(in); err != nil {
		return Endpoint{}, err
	}
	key, ok := endpointID(id)
	if !ok {
		return Endpoint{}, notFound("update webhook endpoint", id, pgx.ErrNoRows)
	}
	if in.URL == nil && in.Description == nil && in.EventTypes == nil && in.RateLimit == nil && !in.ClearRateLimit {
		return s.Get(ctx, db, account, id)
	}
	var types []string
	if in.EventTypes != nil {
		types = *in.EventTypes
		if types == nil {
			types = []string{}
		}
	}
	e, err := scan(db.QueryRow(ctx, `
		UPDATE webhook_endpoints SET
		    url = coalesce($3, url),
		    description = coalesce($4, description),
		    event_types = CASE WHEN $5 THEN $6::text[] ELSE event_types END,
		    rate_limit = CASE WHEN $7 THEN NULL ELSE coalesce($8, rate_limit) END,
		    updated_at = $9
		WHERE id = $1 AND account_id = $2
		RETURNING `+columns,
		key, account, in.URL, in.Description, in.EventTypes != nil, types, in.ClearRateLimit, in.RateLimit, s.now().UTC()))
	if err != nil {
		return Endpoint{}, notFound("update webhook endpoint", id, err)
	}
	return e, nil
}

// Delete removes account's endpoint id, with its deliveries and their
// attempts. A message none of whose deliveries is left goes with the
// deliveries' retention.
func (s *Store) Delete(ctx context.Context, db webhooks.DB, account, id string) error {
	key, ok := endpointID(id)
	if !ok {
		return notFound("delete webhook endpoint", id, pgx.ErrNoRows)
	}
	// The endpoint's deliveries (and their attempts) go with it; so do
	// the messages no other endpoint has a delivery of, which nothing
	// else would ever purge (retention walks deliveries). One statement
	// sees one snapshot: the other deliveries are told apart by endpoint.
	var deleted bool
	err := db.QueryRow(ctx, `
		WITH e AS (
		    DELETE FROM webhook_endpoints WHERE id = $1 AND account_id = $2 RETURNING id
		), d AS (
		    DELETE FROM webhook_endpoint_deliveries WHERE endpoint_id IN (SELECT id FROM e) RETURNING message_id
		), m AS (
		    DELETE FROM webhook_messages msg WHERE msg.id IN (SELECT message_id FROM d)
		      AND NOT EXISTS (SELECT 1 FROM webhook_endpoint_deliveries o
		                      WHERE o.message_id = msg.id AND o.endpoint_id <> $1)
		)
		SELECT EXISTS (SELECT 1 FROM e)`, key, account).Scan(&deleted)
	if err != nil {
		return fmt.Errorf("delete webhook endpoint %s: %w", id, err)
	}
	if !deleted {
		return notFound("delete webhook endpoint", id, pgx.ErrNoRows)
	}
	return nil
}

// Disable stops deliveries to account's endpoint id (reason "manual"; an
// endpoint already disabled keeps its reason and time). Its pending
// deliveries fail with "endpoint disabled", in the same statement, so
// that none of them takes the sender's capacity; recovering the endpoint
// once enabled sends them again. A delivery in flight settles as a lost
// lease.
func (s *Store) Disable(ctx context.Context, db webhooks.DB, account, id string) (Endpoint, error) {
	key, ok := endpointID(id)
	if !ok {
		return Endpoint{}, notFound("disable webhook endpoint", id, pgx.ErrNoRows)
	}
	e, err := scan(db.QueryRow(ctx, `
		WITH e AS (
		    UPDATE webhook_endpoints SET
		        disabled_at = coalesce(disabled_at, $3), disabled_reason = coalesce(disabled_reason, 'manual'),
		        updated_at = CASE WHEN disabled_at IS NULL THEN $3 ELSE updated_at END
		    WHERE id = $1 AND account_id = $2
		    RETURNING `+columns+`
		), failed AS (
		    UPDATE webhook_endpoint_deliveries d SET
		        status = 'failed', last_error = 'endpoint disabled', settled_at = $3, lease_token = NULL
		    FROM e WHERE d.endpoint_id = e.id::uuid AND d.status = 'pending'
		)
		SELECT * FROM e`, key, account, s.now().UTC()))
	if err != nil {
		return Endpoint{}, notFound("disable webhook endpoint", id, err)
	}
	return e, nil
}

// Enable lets deliveries go to account's endpoint id again, with a clean
// health record: no failing run, no open circuit. Its deliveries that
// were waiting for the circuit's end are due now, as after a successful
// probe. It sends nothing that failed while it was disabled: that is
// recovery's, a separate request.
func (s *Store) Enable(ctx context.Context, db webhooks.DB, account, id string) (Endpoint, error) {
	key, ok := endpointID(id)
	if !ok {
		return Endpoint{}, notFound("enable webhook endpoint", id, pgx.ErrNoRows)
	}
	now := s.now().UTC()
	e, err := scan(db.QueryRow(ctx, `
		WITH old AS (
		    SELECT id, greatest(circuit_open_until, held_until) AS held_end,
		           disabled_at IS NOT NULL OR failing_since IS NOT NULL
		           OR consecutive_failures <> 0 OR circuit_open_until IS NOT NULL OR held_until IS NOT NULL AS changed
		    FROM webhook_endpoints WHERE id = $1 AND account_id = $2 FOR UPDATE
		), e AS (
		    UPDATE webhook_endpoints w SET
		        disabled_at = NULL, disabled_reason = NULL, failing_since = NULL, consecutive_failures = 0,
		        circuit_open_until = NULL, held_until = NULL, updated_at = CASE WHEN old.changed THEN $3 ELSE w.updated_at END
		    FROM old WHERE w.id = old.id
		    RETURNING w.id::text, w.account_id, w.url, w.description, w.event_types, w.api_version, w.rate_limit,
		        w.disabled_reason, w.disabled_at, w.failing_since, w.created_at, w.updated_at
		), due AS (
		    UPDATE webhook_endpoint_deliveries d
		    SET next_attempt_at = CASE WHEN d.lease_token IS NULL AND old.held_end IS NOT NULL AND d.next_attempt_at > $3
		                                    AND d.next_attempt_at <= old.held_end THEN $3
		                               ELSE d.next_attempt_at END,
		        suspect = false
		    FROM old
		    WHERE d.endpoint_id = old.id AND d.status = 'pending'
		      AND (d.suspect OR (d.lease_token IS NULL AND old.held_end IS NOT NULL AND d.next_attempt_at > $3
		                         AND d.next_attempt_at <= old.held_end))
		)
		SELECT * FROM e`, key, account, now))
	if err != nil {
		return Endpoint{}, notFound("enable webhook endpoint", id, err)
	}
	return e, nil
}

// RotateSecret gives account's endpoint id a new signing secret, returned
// this once. The one it replaces is kept, as stored, until now +
// Config.SecretGrace: the sender signs with both until then, so that the
// account can switch without losing a webhook. A rotation during the grace
// of another drops the oldest secret.
func (s *Store) RotateSecret(ctx context.Context, db webhooks.DB, account, id string) (Rotated, error) {
	key, ok := endpointID(id)
	if !ok {
		return Rotated{}, notFound("rotate webhook secret", id, pgx.ErrNoRows)
	}
	secret, err := signing.NewSecret()
	if err != nil {
		return Rotated{}, err
	}
	stored, err := s.sealed(secret, key)
	if err != nil {
		return Rotated{}, err
	}
	now := s.now().UTC()
	var until *time.Time
	if s.grace > 0 {
		t := now.Add(s.grace)
		until = &t
	}
	tag, err := db.Exec(ctx, `
		UPDATE webhook_endpoints SET
		    previous_secret = CASE WHEN $4::timestamptz IS NULL THEN NULL ELSE secret END,
		    previous_secret_expires_at = $4, secret = $3, updated_at = $5
		WHERE id = $1 AND account_id = $2`, key, account, stored, until, now)
	if err != nil {
		return Rotated{}, fmt.Errorf("rotate webhook secret %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return Rotated{}, notFound("rotate webhook secret", id, pgx.ErrNoRows)
	}
	return Rotated{EndpointID: key, Secret: secret, PreviousSecretExpiresAt: until}, nil
}
