package webhookapi

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
)

// DefaultMaxRecoverAge is Config.MaxRecoverAge's default.
const DefaultMaxRecoverAge = 30 * 24 * time.Hour

// CommandFunc runs a command: fn in a transaction, its result written as
// JSON with status, its error answered (see [WriteKnownError]). in is the
// decoded request (an empty struct for a command without a body), for an
// Idempotency-Key wrapper to hash; such a wrapper stores the ShownOnce
// form of a result that implements [ShownOncer].
type CommandFunc func(w http.ResponseWriter, r *http.Request, in any, status int,
	fn func(ctx context.Context, tx pgx.Tx) (any, error))

// ShownOncer is a response that holds a secret shown once (a created
// endpoint, a rotation): an Idempotency-Key replay answers ShownOnce(),
// the response without the secret, which is kept nowhere in plaintext.
type ShownOncer interface {
	ShownOnce() any
}

// Config configures an [API].
type Config struct {
	// Endpoints is the store of endpoints. Required.
	Endpoints *endpoints.Store
	// Pool runs the reads, and the commands when Command is nil. Required.
	Pool *pgxpool.Pool
	// AccountParam is the path value that holds the account id in the
	// prefix the routes are mounted under: "account" when empty (as in
	// "/accounts/{account}").
	AccountParam string
	// Authorize reports whether the request's caller may act on account.
	// false answers 404 not_found, as for an account that does not exist,
	// so that a caller learns nothing of accounts it may not see.
	// Required: the routes have no authentication of their own.
	Authorize func(r *http.Request, account string) bool
	// CanonicalAccount returns the account a path's spelling names, as
	// the service records its events' accounts ("ABC..." and "abc..." are
	// one merchant id), and false for a spelling that names none (404).
	// The endpoints are then stored, and authorized, under the canonical
	// form, so that the events of the account reach them. nil: the path
	// value as it is.
	CanonicalAccount func(account string) (string, bool)
	// Command runs the routes that change something: the service's own
	// wrapper (Idempotency-Key, tracing, error mapping). nil runs fn in a
	// transaction of Pool and answers its error with [WriteKnownError], or
	// 500 with the detail in the log.
	Command CommandFunc
	// Wake is called after a command that made deliveries due (resend,
	// recover, test, enable) answered 2xx: a sender in the same process
	// polls at once instead of at its next tick. Optional.
	Wake func()
	// MaxRecoverAge bounds how far back a recovery may start: 0 is
	// [DefaultMaxRecoverAge]. Deliveries older than the service's
	// retention are gone anyway.
	MaxRecoverAge time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock a recovery's since is checked against; nil is
	// time.Now. For tests.
	Now func() time.Time
}

// API serves an account's webhook endpoints and deliveries.
type API struct {
	store      *endpoints.Store
	pool       *pgxpool.Pool
	param      string
	authorize  func(*http.Request, string) bool
	canonical  func(string) (string, bool)
	command    CommandFunc
	wake       func()
	maxRecover time.Duration
	logger     *slog.Logger
	now        func() time.Time
}

func (c *Config) setDefaults() {
	c.AccountParam = cmp.Or(c.AccountParam, "account")
	c.MaxRecoverAge = cmp.Or(c.MaxRecoverAge, DefaultMaxRecoverAge)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Endpoints != nil, "Endpoints", "is required")
	check(c.Pool != nil, "Pool", "is required")
	check(c.Authorize != nil, "Authorize", "is required (the routes have no authentication of their own)")
	check(c.MaxRecoverAge > 0, "MaxRecoverAge", "must be positive")
	return errs.Err("webhookapi config")
}

// New returns the API.
func New(cfg Config) (*API, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &API{store: cfg.Endpoints, pool: cfg.Pool, param: cfg.AccountParam, authorize: cfg.Authorize,
		canonical: cfg.CanonicalAccount, command: cfg.Command, wake: cfg.Wake, maxRecover: cfg.MaxRecoverAge,
		logger: cfg.Logger, now: cfg.Now}
	if a.command == nil {
		a.command = a.inTx // a method value: not a Config default
	}
	return a, nil
}

// Route is one path of the API, relative to where it is mounted.
type Route struct {
	// Pattern is the path, with its wildcards ({endpoint}, {message}), to
	// append to the prefix that holds the account: "/webhook_endpoints".
	Pattern string
	// Methods are its handlers by HTTP method, for a service that
	// registers "METHOD path" patterns itself.
	Methods map[string]http.HandlerFunc
	// Handler serves every method: those not in Methods get a JSON 405
	// with Allow.
	Handler http.Handler
}

// Routes returns the API's paths: the service registers each under its
// prefix, behind its authentication (see [API.Mount]).
func (a *API) Routes() []Route {
	routes := []Route{
		{Pattern: "/webhook_endpoints", Methods: map[string]http.HandlerFunc{
			http.MethodPost: a.create, http.MethodGet: a.list}},
		{Pattern: "/webhook_endpoints/{endpoint}", Methods: map[string]http.HandlerFunc{
			http.MethodGet: a.get, http.MethodPatch: a.update, http.MethodDelete: a.delete}},
		{Pattern: "/webhook_endpoints/{endpoint}/disable", Methods: map[string]http.HandlerFunc{http.MethodPost: a.disable}},
		{Pattern: "/webhook_endpoints/{endpoint}/enable", Methods: map[string]http.HandlerFunc{http.MethodPost: a.enable}},
		{Pattern: "/webhook_endpoints/{endpoint}/secret/rotate", Methods: map[string]http.HandlerFunc{http.MethodPost: a.rotate}},
		{Pattern: "/webhook_endpoints/{endpoint}/messages", Methods: map[string]http.HandlerFunc{http.MethodGet: a.messages}},
		{Pattern: "/webhook_endpoints/{endpoint}/messages/{message}/attempts", Methods: map[string]http.HandlerFunc{
			http.MethodGet: a.attempts}},
		{Pattern: "/webhook_endpoints/{endpoint}/messages/{message}/resend", Methods: map[string]http.HandlerFunc{
			http.MethodPost: a.resend}},
		{Pattern: "/webhook_endpoints/{endpoint}/recover", Methods: map[string]http.HandlerFunc{http.MethodPost: a.recoverSince}},
		{Pattern: "/webhook_endpoints/{endpoint}/test", Methods: map[string]http.HandlerFunc{http.MethodPost: a.sendTest}},
	}
	for i := range routes {
		routes[i].Handler = byMethod(routes[i].Methods)
	}
	return routes
}

// Mount registers the routes on mux under prefix, which holds the
// account's path value: Mount(mux, "/v1/merchants/{id}") with
// AccountParam "id". The mux's handler must authenticate: Authorize only
// decides whether the authenticated caller may act on the account.
func (a *API) Mount(mux *http.ServeMux, prefix string) {
	prefix = strings.TrimSuffix(prefix, "/")
	for _, rt := range a.Routes() {
		mux.Handle(prefix+rt.Pattern, rt.Handler)
	}
}

// byMethod dispatches on the method, answering the others with a JSON 405
// rather than ServeMux's plain-text one.
func byMethod(methods map[string]http.HandlerFunc) http.Handler {
	allow := make([]string, 0, len(methods))
	for m := range methods {
		allow = append(allow, m)
	}
	slices.Sort(allow)
	allowed := strings.Join(allow, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := methods[r.Method]
		if !ok && r.Method == http.MethodHead {
			h, ok = methods[http.MethodGet]
		}
		if !ok {
			w.Header().Set("Allow", allowed)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use "+allowed, "")
			return
		}
		h(w, r)
	})
}

// account returns the account the path names when the caller may act on
// it; else it answers 404, as for an account that does not exist.
func (a *API) account(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue(a.param)
	account, ok := id, id != ""
	if ok && a.canonical != nil {
		account, ok = a.canonical(id)
	}
	if !ok || account == "" || !a.authorize(r, account) {
		writeNotFound(w, "account "+id)
		return "", false
	}
	return account, true
}

// inTx is the command runner when Config.Command is nil.
func (a *API) inTx(w http.ResponseWriter, r *http.Request, _ any, status int,
	fn func(ctx context.Context, tx pgx.Tx) (any, error),
) {
	ctx := r.Context()
	var out any
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) (err error) {
		out, err = fn(ctx, tx)
		return err
	})
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, status, out)
}

// writeError answers err: the packages' typed errors as WriteKnownError
// does, anything else a 500 whose detail goes to the log only.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case WriteKnownError(w, err):
	case r.Context().Err() != nil && errors.Is(err, r.Context().Err()):
		writeError(w, http.StatusServiceUnavailable, "canceled", "the request was canceled", "")
	default:
		a.logger.ErrorContext(r.Context(), "webhook api request failed", slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		writeError(w, http.StatusInternalServerError, "internal", "internal error", "")
	}
}

// run runs a command with the service's runner, then wakes the sender if
// wake and the command answered 2xx (it committed, or replayed one that
// had).
func (a *API) run(w http.ResponseWriter, r *http.Request, in any, status int, wake bool,
	fn func(ctx context.Context, tx pgx.Tx) (any, error),
) {
	if !wake || a.wake == nil {
		a.command(w, r, in, status, fn)
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	a.command(rec, r, in, status, fn)
	if rec.status >= 200 && rec.status < 300 {
		a.wake()
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
