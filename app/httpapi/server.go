package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/webhooks/webhookapi"
)

// maxBody bounds request bodies.
const maxBody = 1 << 20

// Config configures the API handler.
type Config struct {
	// Service runs the commands. Required.
	Service *app.Service
	// Pool backs the Idempotency-Key store and /readyz. Required.
	Pool *pgxpool.Pool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// RateLimit is each API key's token bucket; the zero value is no limit.
	// `outflow serve` sets [DefaultRateLimit] unless told otherwise.
	RateLimit RateLimit
	// WakeWebhooks, when set, is called after a webhook command made
	// deliveries due (resend, recover, test, enable): the Wake of a
	// webhook sender in this process. nil: the senders find them at their
	// next poll.
	WakeWebhooks func()
}

// API is the HTTP handler of the payments service.
type API struct {
	svc    *app.Service
	pool   *pgxpool.Pool
	logger *slog.Logger
	mux    *http.ServeMux
	limits *limiters // nil: no rate limit
	// webhooks serves /v1/merchants/{id}/webhook_endpoints/...
	webhooks *webhookapi.API
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Service != nil, "Service", "is required")
	check(c.Pool != nil, "Pool", "is required")
	if err := c.RateLimit.validate(); err != nil {
		errs = append(errs, err)
	}
	return errs.Err("httpapi config")
}

// New returns the API handler.
func New(cfg Config) (*API, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &API{svc: cfg.Service, pool: cfg.Pool, logger: cfg.Logger, mux: http.NewServeMux()}
	if cfg.RateLimit.enabled() {
		a.limits = newLimiters(cfg.RateLimit, time.Now)
	}
	store, err := cfg.Service.WebhookEndpoints()
	if err != nil {
		return nil, fmt.Errorf("httpapi config: %w", err)
	}
	// The merchants' webhook endpoints and deliveries, under the merchant
	// as every /v1/merchants/{id}/... route: the same authentication,
	// Idempotency-Key wrapper and error shape.
	a.webhooks, err = webhookapi.New(webhookapi.Config{Endpoints: store, Pool: cfg.Pool, AccountParam: "id",
		Authorize: a.mayManageWebhooks, CanonicalAccount: app.CanonicalMerchantID, Command: a.command,
		Wake: cfg.WakeWebhooks, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("httpapi config: %w", err)
	}
	a.routes()
	return a, nil
}

func (a *API) routes() {
	a.handle("/healthz", http.MethodGet, a.healthz)
	a.handle("/readyz", http.MethodGet, a.readyz)
	a.handle("/v1/merchants", http.MethodPost, a.createMerchant)
	a.handle("/v1/merchants/{id}", http.MethodGet, a.getMerchant)
	a.handle("/v1/merchants/{id}/stats", http.MethodGet, a.getMerchantStats)
	a.handle("/v1/merchants/{id}/api_keys", http.MethodPost, a.createMerchantKey)
	a.handle("/v1/merchants/{id}/webhook_secret/rotate", http.MethodPost, a.rotateWebhookSecret)
	a.webhooks.Mount(a.mux, "/v1/merchants/{id}")
	a.handle("/v1/payments", http.MethodPost, a.createPayment)
	a.handle("/v1/payments/{id}", http.MethodGet, a.getPayment)
	a.handle("/v1/payments/{id}/pay", http.MethodPost, a.pay)
	a.handle("/v1/payments/{id}/refund", http.MethodPost, a.refund)
	a.handle("/v1/payments/{id}/cancel", http.MethodPost, a.cancel)
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint", "")
	})
}

// handle registers path for one method, answering other methods with a JSON
// 405 rather than ServeMux's plain-text one.
func (a *API) handle(path, method string, h http.HandlerFunc) {
	a.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use "+method, "")
			return
		}
		h(w, r)
	})
}

// ServeHTTP adds the request's correlation id and server span (see
// startSpan) to its context, so events written while serving it carry them,
// and logs the request without its body.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	corr := r.Header.Get("X-Correlation-ID")
	if !validHeaderText(corr) {
		writeError(w, http.StatusBadRequest, "invalid_header", "X-Correlation-ID: must be UTF-8 text without control characters", "X-Correlation-ID")
		return
	}
	if corr == "" || len(corr) > 128 {
		corr = uuid.NewString()
	}
	w.Header().Set("X-Correlation-ID", corr)
	ctx := events.WithCorrelationID(r.Context(), corr)
	ctx, span := a.startSpan(ctx, r)
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	defer func() { endSpan(span, rec.status) }()
	if openPaths[r.URL.Path] {
		a.mux.ServeHTTP(rec, r.WithContext(ctx))
	} else {
		a.authenticate(rec, r.WithContext(ctx), a.mux)
	}
	a.logger.LogAttrs(ctx, slog.LevelDebug, "http request",
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", rec.status), slog.Duration("duration", time.Since(start)),
		slog.String("correlation_id", corr))
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (a *API) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *API) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.pool.Ping(ctx); err != nil {
		a.logger.WarnContext(ctx, "readiness check failed", slog.String("error", err.Error()))
		writeError(w, http.StatusServiceUnavailable, "database_unavailable", "the database is not reachable", "")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *API) createMerchant(w http.ResponseWriter, r *http.Request) {
	if !a.requireAdmin(w, r) {
		return
	}
	var in app.NewMerchant
	if !decodeBody(w, r, &in, true) {
		return
	}
	a.command(w, r, in, http.StatusCreated, func(ctx context.Context, tx pgx.Tx) (any, error) {
		m, err := a.svc.CreateMerchantTx(ctx, tx, in)
		if err != nil {
			return nil, err
		}
		key, err := apikey.Create(ctx, tx, apikey.New{MerchantID: m.ID})
		if err != nil {
			return nil, err
		}
		return createdMerchant{CreatedMerchant: m, APIKey: key.Secret}, nil
	})
}

func (a *API) getMerchant(w http.ResponseWriter, r *http.Request) {
	if !a.requireMerchant(w, r) {
		return
	}
	m, err := a.svc.GetMerchant(r.Context(), r.PathValue("id"))
	if err != nil {
		a.writeAppError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

func (a *API) getMerchantStats(w http.ResponseWriter, r *http.Request) {
	if !a.requireMerchant(w, r) {
		return
	}
	st, err := a.svc.GetMerchantStats(r.Context(), r.PathValue("id"))
	if err != nil {
		a.writeAppError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *API) createPayment(w http.ResponseWriter, r *http.Request) {
	var in app.NewPayment
	if !decodeBody(w, r, &in, true) {
		return
	}
	a.command(w, r, in, http.StatusCreated, func(ctx context.Context, tx pgx.Tx) (any, error) {
		if err := a.mayPayTo(ctx, in); err != nil {
			return nil, err
		}
		return a.svc.CreatePaymentTx(ctx, tx, in)
	})
}

func (a *API) getPayment(w http.ResponseWriter, r *http.Request) {
	p, err := a.svc.GetPayment(r.Context(), r.PathValue("id"))
	if err == nil && !mayActOn(r.Context(), p.MerchantID) {
		err = notFoundPayment(p.ID)
	}
	if err != nil {
		a.writeAppError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// emptyBody is the body of commands that take no input: none, or {}.
type emptyBody struct{}

func (a *API) pay(w http.ResponseWriter, r *http.Request) {
	var in emptyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	id := r.PathValue("id")
	if !a.requirePayment(w, r, id) {
		return
	}
	a.command(w, r, in, http.StatusOK, func(ctx context.Context, tx pgx.Tx) (any, error) {
		return a.svc.PayTx(ctx, tx, id)
	})
}

type refundBody struct {
	Amount *int64 `json:"amount,omitempty"`
}

func (a *API) refund(w http.ResponseWriter, r *http.Request) {
	var in refundBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	if in.Amount != nil && *in.Amount <= 0 {
		writeError(w, http.StatusUnprocessableEntity, "invalid_field", "amount: must be a positive integer in minor units", "amount")
		return
	}
	if in.Amount != nil && *in.Amount > app.MaxAmount {
		writeError(w, http.StatusUnprocessableEntity, "invalid_field", fmt.Sprintf("amount: must be at most %d minor units", app.MaxAmount), "amount")
		return
	}
	id := r.PathValue("id")
	if !a.requirePayment(w, r, id) {
		return
	}
	a.command(w, r, in, http.StatusOK, func(ctx context.Context, tx pgx.Tx) (any, error) {
		return a.svc.RefundTx(ctx, tx, id, in.Amount)
	})
}

func (a *API) cancel(w http.ResponseWriter, r *http.Request) {
	var in emptyBody
	if !decodeBody(w, r, &in, false) {
		return
	}
	id := r.PathValue("id")
	if !a.requirePayment(w, r, id) {
		return
	}
	a.command(w, r, in, http.StatusOK, func(ctx context.Context, tx pgx.Tx) (any, error) {
		return a.svc.CancelTx(ctx, tx, id)
	})
}
