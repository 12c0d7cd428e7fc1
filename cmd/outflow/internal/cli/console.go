package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/internal/console"
	"github.com/outflow-dev/outflow/internal/redact"
)

func newConsoleCmd(e *env) *cobra.Command {
	var (
		addr            string
		partitions      int
		shutdownTimeout time.Duration
		aggregateType   string
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operator console: the pipeline's state, an event's journey, retry and discard, behind the admin API key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if partitions < 1 || partitions > 1024 {
				return errors.New("invalid --stream-partitions: must be between 1 and 1024")
			}
			if shutdownTimeout <= 0 {
				return errors.New("invalid --shutdown-timeout: must be positive")
			}
			cfg, logger, err := e.load()
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("addr") {
				if _, _, err := net.SplitHostPort(addr); err != nil {
					return fmt.Errorf("invalid --addr: want host:port, such as 127.0.0.1:8090: %q", addr)
				}
				// Load checked --console-insecure-cookie against the
				// address it knew; this one replaces it.
				if cfg.ConsoleInsecureCookie && !config.Loopback(addr) {
					return fmt.Errorf("invalid --addr: --console-insecure-cookie serves only a loopback address (127.0.0.1, ::1, localhost), not %q: serve the console behind TLS", addr)
				}
				cfg.ConsoleAddr = addr
			}
			if strings.TrimSpace(aggregateType) == "" {
				return errors.New("invalid --aggregate-type: empty")
			}
			return serveConsole(cmd.Context(), cfg, partitions, shutdownTimeout, aggregateType, logger)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", config.DefaultConsoleAddr, "address the console listens on (overrides --console-addr)")
	cmd.Flags().IntVar(&partitions, "stream-partitions", 1, "the forwarder's --stream-partitions, for the consumers' lag")
	cmd.Flags().DurationVar(&shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long SIGTERM waits for in-flight requests")
	cmd.Flags().StringVar(&aggregateType, "aggregate-type", "payment", "the aggregate type a journey's query names when it is not a message id (a service of your own: its aggregates' type)")
	return cmd
}

// serveConsole serves the console on cfg.ConsoleAddr until ctx is done.
// aggregateType is the journey's (empty: the console's default, payment).
func serveConsole(ctx context.Context, cfg config.Config, partitions int, shutdownTimeout time.Duration, aggregateType string, logger *slog.Logger) error {
	if cfg.ConsoleInsecureCookie {
		// config.Load refuses it off loopback; say it anyway.
		logger.Warn("console: session cookie without Secure (--console-insecure-cookie): plain HTTP on loopback only")
	}
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	h, closeBackend, err := newConsole(ctx, pool, cfg, partitions, aggregateType, logger)
	if err != nil {
		return err
	}
	defer closeBackend()
	// The published rate's sampler runs as long as the server, and ends
	// before the pool closes. Its first sample is taken before the server
	// listens, so that the first overview already has one to compare with.
	if err := h.Sample(ctx); err != nil {
		logger.Warn("console: published rate", "error", err.Error())
	}
	rateCtx, stopRate := context.WithCancel(ctx)
	rateDone := make(chan error, 1)
	go func() { rateDone <- h.Run(rateCtx) }()
	defer func() {
		stopRate()
		if err := <-rateDone; err != nil {
			logger.Warn("console: published rate sampler", "error", err.Error())
		}
	}()
	ln, err := net.Listen("tcp", cfg.ConsoleAddr)
	if err != nil {
		return fmt.Errorf("listen on CONSOLE_ADDR %s: %w", cfg.ConsoleAddr, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadTimeout:       DefaultReadTimeout,
		WriteTimeout:      DefaultWriteTimeout,
		IdleTimeout:       DefaultIdleTimeout,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("console serving", slog.String("addr", ln.Addr().String()), slog.String("database", redact.URL(cfg.DatabaseURL)))
	select {
	case err := <-errc:
		return fmt.Errorf("console http server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("drain console requests: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console http server: %w", err)
	}
	return nil
}

// newConsole builds the console's handler: for the reference app and its
// handlers where its tables are installed, else for the framework's pages
// alone, the operator key logging in (console.Config.FrameworkOnly). The
// broker backend, when reachable, reports the consumers' lag (only reads:
// see readStats) and publishes replays. The returned func closes it.
func newConsole(ctx context.Context, pool *pgxpool.Pool, cfg config.Config, partitions int, aggregateType string, logger *slog.Logger) (*console.Console, func(), error) {
	app, err := appInstalled(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	if !app && cfg.ConsoleOperatorKeySHA256 == nil {
		return nil, nil, fmt.Errorf("invalid --console-operator-key-sha256: required on a database without the reference app's tables (%s), "+
			"whose admin API keys would log in: set CONSOLE_OPERATOR_KEY_SHA256 to the hex SHA-256 of an operator key of 32 random bytes (docs/console.md)", appNotInstalled)
	}
	if app && cfg.ConsoleOperatorKeySHA256 != nil {
		logger.Warn("console: --console-operator-key-sha256 ignored: the reference app's tables are installed, its admin API keys log in")
	}
	var (
		consumers  []console.Consumer
		eventTypes []string
	)
	if app {
		for _, h := range referenceHandlers(nil, handlers.NotifyConfig{}) {
			consumers = append(consumers, console.Consumer{Name: h.Name, Topic: h.Topic})
		}
		// The search offers the event types it sees in the outbox's
		// samples; the app's registry adds those rare enough to miss them.
		reg := events.NewRegistry()
		if err := paymentevents.Register(reg); err != nil {
			return nil, nil, fmt.Errorf("console: payment events: %w", err)
		}
		eventTypes = reg.Types()
	}
	closeBackend := func() {}
	var (
		lag    brokers.LagReporter
		broker forwarder.Broker
	)
	backend, err := brokers.Open(ctx, brokerConfig(cfg, partitions, logger, app))
	if err != nil {
		logger.Warn("console: consumer lag unknown: broker unreachable", "broker", string(cfg.Broker), "error", err.Error())
	} else {
		closeBackend = func() { _ = backend.Close() }
		lag, _ = backend.(brokers.LagReporter)
		broker = backend.Broker()
	}
	ccfg := console.Config{Pool: pool, Logger: logger, Consumers: consumers, Lag: lag, Broker: broker,
		InsecureCookie: cfg.ConsoleInsecureCookie, AggregateType: aggregateType, EventTypes: eventTypes}
	if !app {
		ccfg.FrameworkOnly, ccfg.OperatorKeySHA256 = true, cfg.ConsoleOperatorKeySHA256
		logger.Info("console: the reference app's tables are not installed: the framework's pages alone, the operator key logs in")
	}
	h, err := console.New(ccfg)
	if err != nil {
		closeBackend()
		return nil, nil, err
	}
	return h, closeBackend, nil
}
