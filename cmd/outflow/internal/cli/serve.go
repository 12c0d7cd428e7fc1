package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/redact"
)

// knownRoles lists the roles one process can run.
var knownRoles = []string{"api", "forwarder", "worker", "console"}

func newServeCmd(e *env) *cobra.Command {
	var (
		roles           []string
		shutdownTimeout time.Duration
		keyTTL          time.Duration
		timeouts        httpTimeouts
		metricsAddr     string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the payments service: any mix of the HTTP API, the forwarder and the workers",
		Args:  cobra.NoArgs,
	}
	fwd := addForwardFlags(cmd.Flags())
	wrk := addWorkerFlags(cmd.Flags(), true)
	rl := addRateLimitFlags(cmd.Flags())
	el := addEventLimitFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if len(roles) == 0 {
			return fmt.Errorf("invalid --roles: give at least one of %s", strings.Join(knownRoles, ", "))
		}
		for _, r := range roles {
			if !slices.Contains(knownRoles, r) {
				return fmt.Errorf("invalid --roles: unknown role %q (known: %s)", r, strings.Join(knownRoles, ", "))
			}
		}
		if shutdownTimeout <= 0 {
			return fmt.Errorf("invalid --shutdown-timeout: must be positive")
		}
		if err := timeouts.validate(); err != nil {
			return err
		}
		metricsAddr = resolveMetricsAddr(cmd, metricsAddr)
		if err := validateRetention("idempotency-key-ttl", keyTTL, time.Minute); err != nil {
			return err
		}
		if err := fwd.validate(); err != nil {
			return err
		}
		limit, err := rl.load()
		if err != nil {
			return err
		}
		maxEventBytes, err := el.load()
		if err != nil {
			return err
		}
		wrk.streamPartitions = fwd.streamPartitions
		if err := wrk.validate(); err != nil {
			return err
		}
		cfg, logger, err := e.load()
		if err != nil {
			return err
		}
		warnPlaintextSecrets(cfg, logger)
		ctx := cmd.Context()
		reg := newRegistry()
		ready := e.newReadiness()
		// /metrics has an address of its own: the API's port is the one
		// exposed to clients, and metrics tell them about every merchant.
		if metricsAddr != "" {
			stop, err := serveMetrics(ctx, metricsAddr, reg, ready, logger)
			if err != nil {
				return err
			}
			defer stop()
		}
		var (
			runForwarder func(context.Context) error
			wake         func() // the forwarder's, when it shares the process with the api
		)
		if slices.Contains(roles, "forwarder") {
			if runForwarder, wake, err = buildForwarder(ctx, cfg, fwd, reg, ready, logger); err != nil {
				return err
			}
		}
		var (
			runWorker  func(context.Context) error
			wakeSender func() // the worker's webhook sender, when it shares the process with the api
		)
		if slices.Contains(roles, "worker") {
			if runWorker, wakeSender, err = buildWorker(ctx, cfg, wrk, reg, ready, logger); err != nil {
				return err
			}
		}
		// Every role runs until ctx is done (SIGTERM), then drains.
		var runs []func(context.Context) error
		for _, r := range []func(context.Context) error{runForwarder, runWorker} {
			if r != nil {
				runs = append(runs, r)
			}
		}
		if slices.Contains(roles, "console") {
			// On its own address (--console-addr), never the API's: the
			// API's port is the one exposed to clients.
			runs = append(runs, func(ctx context.Context) error {
				return serveConsole(ctx, cfg, fwd.streamPartitions, shutdownTimeout, "", logger)
			})
		}
		if slices.Contains(roles, "api") {
			// The api marks the process started once it listens.
			runs = append(runs, func(ctx context.Context) error {
				return serve(ctx, cfg, shutdownTimeout, keyTTL, limit, maxEventBytes, timeouts, wake, wakeSender, ready, logger)
			})
		} else {
			ready.markStarted()
		}
		errs := make(chan error, len(runs))
		for _, r := range runs {
			go func() { errs <- r(ctx) }()
		}
		var all []error
		for range runs {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}
	cmd.Flags().StringSliceVar(&roles, "roles", []string{"api"}, "roles to run in this process: "+strings.Join(knownRoles, ","))
	cmd.Flags().DurationVar(&shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long SIGTERM waits for in-flight requests")
	timeouts.register(cmd.Flags())
	addMetricsAddrFlag(cmd.Flags(), &metricsAddr, DefaultMetricsAddr, "address serving /metrics, /healthz and /readyz, apart from the API's")
	cmd.Flags().DurationVar(&keyTTL, "idempotency-key-ttl", 24*time.Hour,
		"how long the api role keeps an Idempotency-Key and its response (longer than any client retries; negative: forever)")
	return cmd
}

// serve runs the HTTP API; wake, when not nil, is called after each command
// commits (the forwarder of the same process: no poll to wait for), and
// wakeSender after a webhook command made deliveries due (the webhook
// sender of the same process; nil: the senders' poll finds them). It adds
// its database to ready, and marks ready started once it listens.
func serve(ctx context.Context, cfg config.Config, shutdownTimeout, keyTTL time.Duration, limit httpapi.RateLimit,
	maxEventBytes int, timeouts httpTimeouts, wake, wakeSender func(), ready *readiness, logger *slog.Logger,
) error {
	dbURL, addr := cfg.DatabaseURL, cfg.HTTPAddr
	pool, err := openPool(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The API is the reference app's: said now, by name, rather than by
	// the first request failing on a missing table.
	installed, err := appInstalled(ctx, pool)
	if err != nil {
		return err
	}
	if !installed {
		return fmt.Errorf("the payments API needs the reference app's tables (%s): run `outflow migrate up --set outflow --set app`", appNotInstalled)
	}

	writer, err := outbox.NewWriter(outbox.Config{Routes: app.Routes, MaxEventBytes: maxEventBytes, Logger: logger})
	if err != nil {
		return err
	}
	svc, err := app.NewService(app.Config{Pool: pool, Events: writer, Logger: logger, AfterCommit: wake,
		AllowPrivateWebhooks: cfg.WebhookAllowPrivate, SecretKey: cfg.SecretKey, WebhookSecretGrace: secretGrace(cfg)})
	if err != nil {
		return err
	}
	api, err := httpapi.New(httpapi.Config{Service: svc, Pool: pool, Logger: logger, RateLimit: limit, WakeWebhooks: wakeSender})
	if err != nil {
		return err
	}
	expire, err := keyExpiry(pool, keyTTL, logger)
	if err != nil {
		return err
	}
	if expire != nil {
		ectx, stop := context.WithCancel(ctx)
		expired := make(chan struct{})
		go func() { defer close(expired); _ = expire(ectx) }()
		defer func() { stop(); <-expired }() // before pool.Close()
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: timeouts.readHeader,
		ReadTimeout:       timeouts.read,
		WriteTimeout:      timeouts.write,
		IdleTimeout:       timeouts.idle,
		MaxHeaderBytes:    64 << 10,
		// In-flight requests keep their own context on shutdown: cancelling
		// them would roll back commands the client is waiting for.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ready.addDatabase(pool)
	ready.markStarted()
	logger.Info("serving", slog.String("addr", ln.Addr().String()), slog.String("database", redact.URL(dbURL)))

	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down: draining in-flight requests", slog.Duration("timeout", shutdownTimeout))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("drain HTTP requests: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	logger.Info("stopped")
	return nil
}
