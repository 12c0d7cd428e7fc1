package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/forwarder"
)

// forwardOptions are the forwarder's tuning flags, shared by `forward` and
// `serve --roles forwarder`.
type forwardOptions struct {
	cfg              forwarder.Config
	streamPartitions int
	trimInterval     time.Duration
	cutoverTo        string
}

func addForwardFlags(fs *pflag.FlagSet) *forwardOptions {
	o := &forwardOptions{}
	fs.IntVar(&o.cfg.BatchSize, "batch-size", 500, "rows per claim")
	fs.DurationVar(&o.cfg.MinPollInterval, "min-poll-interval", 2*time.Millisecond, "first wait after a look that found no row (doubles while nothing is found, up to --poll-interval)")
	fs.DurationVar(&o.cfg.PollInterval, "poll-interval", 250*time.Millisecond, "longest idle wait between two looks for new rows (an index probe)")
	fs.IntVar(&o.cfg.Partitions, "partitions", 16, "outbox partitions leased to instances (the same on every instance)")
	fs.DurationVar(&o.cfg.TakeoverAfter, "takeover-after", 10*time.Second, "lease time: a dead instance's work moves within this plus a fifth")
	fs.IntVar(&o.cfg.MaxAttempts, "max-attempts", 10, "attempts before a failing row is parked")
	fs.DurationVar(&o.cfg.RetryBackoff, "retry-backoff", time.Second, "first retry delay of a failing row (doubles, with jitter)")
	fs.DurationVar(&o.cfg.RetryBackoffMax, "retry-backoff-max", 5*time.Minute, "largest retry delay of a failing row")
	fs.IntVar(&o.cfg.MaxPayloadBytes, "max-payload-bytes", 1<<20, "larger payloads are never sent (retried, then parked); the broker's own limit applies when smaller")
	fs.DurationVar(&o.cfg.Retention, "retention", 15*24*time.Hour, "how long published rows are kept (negative: forever)")
	fs.IntVar(&o.streamPartitions, "stream-partitions", 1, "Redis streams per topic, by hash of the aggregate id")
	fs.StringVar(&o.cutoverTo, "cutover-to", "", "also publish every event to this broker (redis, nats, ...), for a live cutover: see docs/brokers.md")
	fs.DurationVar(&o.trimInterval, "trim-interval", time.Minute, "how often the broker drops what every consumer group acknowledged: Redis streams when the audit is off (audited, the audit trims them at each pass), or the sql broker's rows past their 7-day retention (0: never)")
	return o
}

func (o *forwardOptions) validate() error {
	switch {
	case o.cfg.BatchSize < 1 || o.cfg.BatchSize > 10_000:
		return errors.New("invalid --batch-size: must be between 1 and 10000")
	case o.cfg.PollInterval <= 0:
		return errors.New("invalid --poll-interval: must be positive")
	case o.cfg.MinPollInterval <= 0 || o.cfg.MinPollInterval > o.cfg.PollInterval:
		return errors.New("invalid --min-poll-interval: must be positive and at most --poll-interval")
	case o.cfg.Partitions < 1 || o.cfg.Partitions > 4096:
		return errors.New("invalid --partitions: must be between 1 and 4096")
	case o.cfg.TakeoverAfter < time.Second:
		return errors.New("invalid --takeover-after: must be at least 1s")
	case o.cfg.MaxAttempts < 1:
		return errors.New("invalid --max-attempts: must be at least 1")
	case o.cfg.RetryBackoff <= 0 || o.cfg.RetryBackoffMax < o.cfg.RetryBackoff:
		return errors.New("invalid --retry-backoff / --retry-backoff-max: positive, and the first at most the second")
	case o.cfg.MaxPayloadBytes < 1:
		return errors.New("invalid --max-payload-bytes: must be positive")
	case o.cfg.Retention == 0:
		return errors.New("invalid --retention: must be non-zero (negative keeps rows forever)")
	case o.streamPartitions < 1 || o.streamPartitions > 1024:
		return errors.New("invalid --stream-partitions: must be between 1 and 1024")
	case o.cutoverTo != "" && !validKind(o.cutoverTo):
		_, err := brokers.ParseKind(o.cutoverTo)
		return fmt.Errorf("invalid --cutover-to: %w", err)
	case o.trimInterval < 0:
		return errors.New("invalid --trim-interval: must not be negative")
	}
	return nil
}

func newForwardCmd(e *env) *cobra.Command {
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "forward",
		Short: "Run the forwarder: move committed outbox rows to Redis Streams",
		Long: `Run the forwarder alone. Start as many as you like, on as many machines: they share the
outbox's partitions, keep each aggregate's events in order, and take over each other's work
when one dies. SIGTERM finishes the batch in flight and hands the partitions back.`,
		Args: cobra.NoArgs,
	}
	opts := addForwardFlags(cmd.Flags())
	addMetricsAddrFlag(cmd.Flags(), &metricsAddr, DefaultMetricsAddr, "address serving /metrics, /healthz and /readyz")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := opts.validate(); err != nil {
			return err
		}
		cfg, logger, err := e.load()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		reg := newRegistry()
		ready := e.newReadiness()
		run, _, err := buildForwarder(ctx, cfg, opts, reg, ready, logger)
		if err != nil {
			return err
		}
		if metricsAddr = resolveMetricsAddr(cmd, metricsAddr); metricsAddr != "" {
			stop, err := serveMetrics(ctx, metricsAddr, reg, ready, logger)
			if err != nil {
				return err
			}
			defer stop()
		}
		ready.markStarted()
		return run(ctx)
	}
	return cmd
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// buildForwarder connects to PostgreSQL and the broker (failing fast,
// naming the URL, when either is unreachable) and returns a function that
// runs the forwarder, and the broker trimmer (Redis streams, sql tables), until ctx is done,
// and the forwarder's Wake, for a writer in the same process.
//
// It adds the database, the broker and the forwarder's leases to ready.
func buildForwarder(ctx context.Context, c config.Config, o *forwardOptions, reg prometheus.Registerer, ready *readiness,
	logger *slog.Logger,
) (func(context.Context) error, func(), error) {
	pool, err := openPool(ctx, c.DatabaseURL)
	if err != nil {
		return nil, nil, err
	}
	app, err := appInstalled(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	backend, err := brokers.Open(ctx, brokerConfig(c, o.streamPartitions, logger, app))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	broker := backend.Broker()
	closeBackends := backend.Close
	if o.cutoverTo != "" {
		tc := c
		tc.Broker, _ = brokers.ParseKind(o.cutoverTo)
		if tc.Broker == c.Broker {
			pool.Close()
			backend.Close()
			return nil, nil, errors.New("invalid --cutover-to: it names the --broker already in use")
		}
		next, err := brokers.Open(ctx, brokerConfig(tc, o.streamPartitions, logger, app))
		if err != nil {
			pool.Close()
			backend.Close()
			return nil, nil, fmt.Errorf("--cutover-to: %w", err)
		}
		broker = brokers.Tee(broker, next.Broker())
		closeBackends = func() error { return errors.Join(next.Close(), backend.Close()) }
		logger.Info("cutover: publishing every event to both brokers", "from", string(c.Broker), "to", string(tc.Broker))
	}
	cfg := o.cfg
	cfg.Pool, cfg.Broker, cfg.Registerer, cfg.Logger = pool, broker, reg, logger
	cfg.MessagingSystem = string(backend.Kind())
	cfg.AuditInterval = c.AuditInterval
	f, err := forwarder.New(cfg)
	if err != nil {
		pool.Close()
		closeBackends()
		return nil, nil, err
	}
	ready.addDatabase(pool)
	ready.addBroker(backend)
	ready.add("forwarder", func(context.Context) error { return f.Ready() })
	return func(ctx context.Context) error {
		defer pool.Close()
		defer closeBackends()
		tctx, stopTrim := context.WithCancel(ctx)
		trimDone := make(chan struct{})
		go func() {
			defer close(trimDone)
			if tt, ok := backend.(brokers.TopicTrimmer); ok && !f.Audits() {
				// Audited, the streams are trimmed by the audit, of what it
				// settled: a trim of entries it has not checked yet could
				// not be told from a failover that lost them.
				trimLoop(tctx, pool, tt, o.trimInterval, logger)
			} else if tr, ok := backend.(brokers.Trimmer); ok {
				trimBrokerLoop(tctx, tr, o.trimInterval, logger)
			}
		}()
		err := f.Run(ctx)
		stopTrim()
		<-trimDone
		return err
	}, f.Wake, nil
}

func validKind(s string) bool {
	_, err := brokers.ParseKind(s)
	return err == nil
}

// serveBackground serves h on addr until the returned stop is called; bound
// is the address it listens on.
func serveBackground(ctx context.Context, addr string, h http.Handler, logger *slog.Logger) (stop func(), bound string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout,
		WriteTimeout: DefaultWriteTimeout, IdleTimeout: DefaultIdleTimeout}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics server", "error", err.Error())
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, ln.Addr().String(), nil
}
