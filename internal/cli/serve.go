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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/events/outbox"
)

// knownRoles lists the roles one process can run.
var knownRoles = []string{"api", "forwarder"}

func newServeCmd(e *env) *cobra.Command {
	var (
		roles           []string
		shutdownTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the payments service: any mix of the HTTP API and the forwarder",
		Args:  cobra.NoArgs,
	}
	fwd := addForwardFlags(cmd.Flags())
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
		if err := fwd.validate(); err != nil {
			return err
		}
		cfg, logger, err := e.load()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		reg := newRegistry()
		var runForwarder func(context.Context) error
		if slices.Contains(roles, "forwarder") {
			if runForwarder, err = buildForwarder(ctx, cfg.DatabaseURL, cfg.RedisURL, fwd, reg, logger); err != nil {
				return err
			}
		}
		if !slices.Contains(roles, "api") {
			return runForwarder(ctx)
		}
		fwdDone := make(chan error, 1)
		if runForwarder != nil {
			go func() { fwdDone <- runForwarder(ctx) }()
		} else {
			fwdDone <- nil
		}
		err = serve(ctx, cfg.DatabaseURL, cfg.HTTPAddr, shutdownTimeout, reg, logger)
		return errors.Join(err, <-fwdDone)
	}
	cmd.Flags().StringSliceVar(&roles, "roles", []string{"api"}, "roles to run in this process: "+strings.Join(knownRoles, ","))
	cmd.Flags().DurationVar(&shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long SIGTERM waits for in-flight requests")
	return cmd
}

func serve(ctx context.Context, dbURL, addr string, shutdownTimeout time.Duration, reg *prometheus.Registry, logger *slog.Logger) error {
	pool, err := openPool(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	writer, err := outbox.NewWriter(outbox.Config{Routes: app.Routes, Logger: logger})
	if err != nil {
		return err
	}
	svc, err := app.NewService(app.Config{Pool: pool, Events: writer, Logger: logger})
	if err != nil {
		return err
	}
	api, err := httpapi.New(httpapi.Config{Service: svc, Pool: pool, Logger: logger})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", api)

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		// In-flight requests keep their own context on shutdown: cancelling
		// them would roll back commands the client is waiting for.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("serving", slog.String("addr", ln.Addr().String()), slog.String("database", redactURL(dbURL)))

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
