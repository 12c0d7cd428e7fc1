package console

import (
	"cmp"
	"context"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/configcheck"
)

// DefaultSessionTTL is how long a login lasts.
const DefaultSessionTTL = 8 * time.Hour

// DefaultPageSize is how many rows a list page shows.
const DefaultPageSize = 50

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Consumer is one consumer the overview and the journey report on.
type Consumer struct {
	Name  string
	Topic string
}

// Config configures [New].
type Config struct {
	// Pool reaches the framework's and the app's tables. Required.
	Pool *pgxpool.Pool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Consumers are listed on the overview (with their lag) and looked up
	// in the journey, in this order.
	Consumers []Consumer
	// Lag reports the consumers' lag; nil shows "n/a".
	Lag brokers.LagReporter
	// Broker publishes replays (to a consumer's replay topic); nil
	// disables replay.
	Broker forwarder.Broker
	// InsecureCookie drops the cookie's Secure attribute, for plain HTTP
	// on a loopback address: a browser does not send a Secure cookie over
	// http://127.0.0.1.
	InsecureCookie bool
	// SessionTTL defaults to [DefaultSessionTTL].
	SessionTTL time.Duration
	// PageSize is the rows of a list's page and the events of a journey's
	// page (one knob: a journey's page is its events' outcomes and
	// deliveries too, read by key for the page only); defaults to
	// [DefaultPageSize].
	PageSize int
	// RateSampleInterval is how often [Console.Run] samples the overview's
	// numbers (the published rate, the status line's rules over time and
	// the charts read the samples); defaults to [DefaultRateSampleInterval].
	RateSampleInterval time.Duration
	// RateWindow is how far back the overview's published rate looks;
	// defaults to [DefaultRateWindow]. Not shorter than RateSampleInterval.
	RateWindow time.Duration
	// AggregateType is what a journey's query names when it is not a
	// message id; defaults to "payment" (a payment id is its aggregate id).
	AggregateType string
	// ReadTimeout bounds every read a page makes of the database, waiting
	// for a connection of the pool included: a page whose reads are stuck
	// behind a lock answers anyway, with what it could not read shown as
	// unavailable. Defaults to [DefaultReadTimeout].
	ReadTimeout time.Duration
	// FrameworkOnly serves a database that holds the framework's tables
	// and none of the reference app's (a service of one's own built on
	// the framework): the login is the operator key of OperatorKeySHA256,
	// sessions are kept in this process's memory (a restart, or another
	// replica, asks to log in again), actions are recorded as the
	// operator key's in the framework's audit (outflow_operator_actions).
	// False, the default, needs the app's tables: logins by its admin API
	// keys, sessions in console_sessions; actions in the same audit. In
	// either mode the webhooks are shown when the webhooks migration set
	// (webhooks/schema) is installed, as not installed otherwise.
	FrameworkOnly bool
	// EventTypes are event types the search offers besides those of the
	// newest events (an events.Registry's Types()): a rare type, absent
	// from the newest events, can then be searched for.
	EventTypes []string
	// OperatorKeySHA256 is the SHA-256 of the operator key that logs in
	// with FrameworkOnly: the key itself is never given to the process.
	// Required with FrameworkOnly, refused without it.
	OperatorKeySHA256 []byte
}

// DefaultReadTimeout is Config.ReadTimeout's default: short enough that
// a page stuck behind a lock still answers within a second.
const DefaultReadTimeout = 700 * time.Millisecond

// ErrInvalidConfig is returned by [New] for a Config it cannot use.
var ErrInvalidConfig = errors.New("console: invalid config")

// Console is the console's http.Handler.
type Console struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	pages map[string]*template.Template

	now func() time.Time // time.Now; a test's clock makes the rate and the login delays exact

	logins *loginThrottle

	mu     sync.Mutex
	rates  rateRing    // the published totals of the last RateWindow
	health healthState // the last hour's samples, for the status line and the charts

	sessions *memSessions // FrameworkOnly's; nil otherwise

	choices choicesCache // the search's filters' choices

	hooksFound atomic.Bool // the webhooks migration set was found installed
}

func (c *Config) setDefaults() {
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	c.SessionTTL = cmp.Or(c.SessionTTL, DefaultSessionTTL)
	c.RateSampleInterval = cmp.Or(c.RateSampleInterval, DefaultRateSampleInterval)
	c.RateWindow = cmp.Or(c.RateWindow, DefaultRateWindow)
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.AggregateType == "" {
		c.AggregateType = "payment"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// validate wraps every error in ErrInvalidConfig.
func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Pool != nil, "Pool", "is required")
	check(c.SessionTTL > 0, "SessionTTL", "must not be negative")
	check(c.PageSize > 0, "PageSize", "must not be negative")
	check(c.RateSampleInterval > 0, "RateSampleInterval", "must not be negative")
	check(c.RateWindow > 0, "RateWindow", "must not be negative")
	check(c.ReadTimeout > 0, "ReadTimeout", "must not be negative")
	if c.RateSampleInterval > 0 && c.RateWindow > 0 && c.RateWindow < c.RateSampleInterval {
		errs = append(errs, fmt.Errorf("RateWindow (%s) must not be shorter than RateSampleInterval (%s)", c.RateWindow, c.RateSampleInterval))
	}
	check(!c.FrameworkOnly || len(c.OperatorKeySHA256) == sha256.Size, "FrameworkOnly",
		fmt.Sprintf("needs OperatorKeySHA256, the %d-byte SHA-256 of the operator key", sha256.Size))
	check(c.FrameworkOnly || c.OperatorKeySHA256 == nil, "OperatorKeySHA256",
		"is for FrameworkOnly: with the app's tables, admin API keys log in")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// New returns the console's handler. It starts nothing: [Console.Run]
// samples the published rate.
func New(cfg Config) (*Console, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), now: time.Now,
		logins: newLoginThrottle(), rates: rateRing{window: cfg.RateWindow}}
	pages, err := parsePages(func() time.Time { return c.now() })
	if err != nil {
		return nil, err
	}
	c.pages = pages
	if cfg.FrameworkOnly {
		c.sessions = &memSessions{byHash: map[string]memSession{}}
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("console: static assets: %w", err)
	}
	for _, rt := range c.routes(http.StripPrefix("/static/", http.FileServerFS(filesOnly{static}))) {
		c.mux.Handle(rt.pattern, rt.h)
	}
	return c, nil
}

// filesOnly is an fs.FS whose directories do not exist: http.FileServerFS
// lists a directory it can open, and the console's assets are for pages
// to load, not for browsing.
type filesOnly struct{ fs.FS }

func (f filesOnly) Open(name string) (fs.File, error) {
	file, err := f.FS.Open(name)
	if err != nil {
		return nil, err
	}
	st, err := file.Stat()
	if err == nil && st.IsDir() {
		err = fs.ErrNotExist
	}
	if err != nil {
		file.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return file, nil
}

type route struct {
	pattern string
	h       http.Handler
}

// routes are the console's: one list, which the tests walk.
func (c *Console) routes(static http.Handler) []route {
	return []route{
		{"GET /static/", static},
		{"GET /login", http.HandlerFunc(c.loginPage)},
		{"POST /login", http.HandlerFunc(c.login)},
		{"POST /logout", c.authed(c.logout)},
		{"GET /{$}", c.authed(c.overviewPage)},
		{"GET /fragments/overview", c.authed(c.overviewFragment)},
		{"GET /journey", c.authed(c.journeyPage)},
		{"GET /parked", c.authed(c.parkedPage)},
		{"POST /parked/retry", c.authed(c.parkedRetry)},
		{"POST /parked/discard", c.authed(c.parkedDiscard)},
		{"GET /dead", c.authed(c.deadPage)},
		{"POST /dead/retry", c.authed(c.deadRetry)},
		{"POST /dead/discard", c.authed(c.deadDiscard)},
		{"POST /replay", c.authed(c.replay)},
		{"GET /actions", c.authed(c.actionsPage)},
		{"GET /search", c.authed(c.searchPage)},
		{"GET /webhooks", c.authed(c.webhooksPage)},
		{"GET /webhooks/accounts/{account}", c.authed(c.accountPage)},
		{"GET /webhooks/endpoints/{id}", c.authed(c.endpointPage)},
		{"POST /webhooks/endpoints/{id}/resend", c.authed(c.endpointAct(webhookResend))},
		{"POST /webhooks/endpoints/{id}/recover", c.authed(c.endpointAct(c.recoverAction()))},
		{"POST /webhooks/endpoints/{id}/test", c.authed(c.endpointAct(webhookTest))},
		{"POST /webhooks/endpoints/{id}/disable", c.authed(c.endpointAct(webhookDisable))},
		{"POST /webhooks/endpoints/{id}/enable", c.authed(c.endpointAct(webhookEnable))},
	}
}

// ServeHTTP serves the console, with headers that keep its pages out of
// frames, caches and other origins' scripts.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if status, msg := readParams(w, r); status != 0 {
		http.Error(w, msg, status)
		return
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		// A page only reads: its session lookup and its queries end by
		// this deadline (the overview's panels, each within ReadTimeout,
		// sooner), so a database stuck behind a lock leaves the console
		// answering instead of holding the request, and its pool's
		// connections, for as long as the lock lasts.
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.ReadTimeout+c.cfg.ReadTimeout/4)
		defer cancel()
		r = r.WithContext(ctx)
	}
	c.mux.ServeHTTP(w, r)
}

// readParams parses every parameter of r, the query's and a POST form's,
// once, before any handler: handlers read them from r.Form and r.PostForm
// (or r.URL.Query(), the same values). A name or value with a NUL byte or
// that is not UTF-8 is refused here, with a 400: PostgreSQL's text and
// jsonb cannot hold them, and a handler passing one on would fail with a
// 500, or worse, after acting. It returns the status and message of a
// refusal, 0 when r may go on.
func readParams(w http.ResponseWriter, r *http.Request) (int, string) {
	if !validText(r.URL.Path) {
		return http.StatusBadRequest, "invalid path: NUL byte or invalid UTF-8"
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			return http.StatusRequestEntityTooLarge, fmt.Sprintf("form too large: at most %d bytes", maxForm)
		}
		return http.StatusBadRequest, "invalid query or form"
	}
	for name, values := range r.Form { // the query's and the form's
		if !validText(name) {
			return http.StatusBadRequest, "invalid parameter name: NUL byte or invalid UTF-8"
		}
		for _, v := range values {
			if !validText(v) {
				return http.StatusBadRequest, fmt.Sprintf("invalid parameter %s: NUL byte or invalid UTF-8", name)
			}
		}
	}
	return 0, ""
}

func validText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

func parsePages(now func() time.Time) (map[string]*template.Template, error) {
	funcs := templateFuncs(now)
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/fragments.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse templates: %w", err)
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"login", "overview", "journey", "parked", "dead", "actions", "confirm", "search", "webhooks", "endpoint", "account"} {
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// page is what every page's template gets.
type page struct {
	Title   string
	CSRF    string
	KeyName string
	Error   string
	Result  *action // the action just taken, shown on the page it returns to
	Data    any
}

func (c *Console) render(w http.ResponseWriter, status int, name string, p page) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := c.pages[name].ExecuteTemplate(w, "layout", p); err != nil {
		c.log.Error("console: render", "page", name, "error", err.Error())
	}
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		c.log.Warn("console: the database did not answer in time", "path", r.URL.Path, "error", err.Error())
		http.Error(w, fmt.Sprintf("the database did not answer within %s (a lock, or an overloaded server): try again", c.cfg.ReadTimeout),
			http.StatusServiceUnavailable)
		return
	}
	c.log.Error("console: request failed", "path", r.URL.Path, "error", err.Error())
	http.Error(w, "internal error (logged)", http.StatusInternalServerError)
}
