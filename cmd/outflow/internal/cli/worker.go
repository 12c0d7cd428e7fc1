package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/actionlog"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

// workerOptions are the consumers' tuning flags, shared by `worker` and
// `serve --roles worker`.
type workerOptions struct {
	streamPartitions int
	claimIdle        time.Duration
	maxAttempts      int
	retryBackoff     time.Duration
	retryBackoffMax  time.Duration
	gapTimeout       time.Duration
	retention        time.Duration
	batchSize        int
	webhookTimeout   time.Duration
	webhookInFlight  int
	webhookPerMerch  int
	// perMerchSet says whether --webhook-per-merchant was given: when not,
	// its default follows a lower --webhook-concurrency down.
	perMerchSet func() bool
}

func addWorkerFlags(fs *pflag.FlagSet, sharedStreamPartitions bool) *workerOptions {
	o := &workerOptions{}
	if !sharedStreamPartitions {
		fs.IntVar(&o.streamPartitions, "stream-partitions", 1, "Redis streams per topic (the forwarder's value)")
	}
	fs.DurationVar(&o.claimIdle, "claim-idle", brokers.DefaultClaimIdle, "a message unacknowledged this long is claimed by another worker (keep above the slowest handler)")
	fs.IntVar(&o.batchSize, "consumer-batch-size", 100, "stream entries read at once; messages handled together share one transaction (1: one transaction per message)")
	fs.IntVar(&o.maxAttempts, "handler-max-attempts", 8, "attempts before a failing message is dead-lettered")
	fs.DurationVar(&o.retryBackoff, "handler-retry-backoff", time.Second, "first retry delay of a failing message (doubles, with jitter)")
	fs.DurationVar(&o.retryBackoffMax, "handler-retry-backoff-max", 5*time.Minute, "largest retry delay of a failing message")
	fs.DurationVar(&o.gapTimeout, "gap-timeout", 5*time.Minute, "how long an event waits for its predecessor before it is marked dead")
	fs.DurationVar(&o.retention, "processed-retention", 15*24*time.Hour,
		"how long resolved dead letters and settled webhook deliveries are kept, and processed_messages (no longer written) after its newest row (above the longest redelivery window; negative: forever)")
	fs.DurationVar(&o.webhookTimeout, "webhook-timeout", 10*time.Second, "how long one webhook request may take before it is cancelled and retried (webhooks/sender Config.Timeout)")
	fs.IntVar(&o.webhookInFlight, "webhook-concurrency", 64, "webhook requests in flight at once in this process")
	fs.IntVar(&o.webhookPerMerch, "webhook-per-merchant", 4, "webhook requests in flight at once to one webhook endpoint in this process (a merchant's endpoint that hangs holds only these; at most --webhook-concurrency)")
	o.perMerchSet = func() bool { return fs.Changed("webhook-per-merchant") }
	return o
}

func (o *workerOptions) validate() error {
	if !o.perMerchSet() && o.webhookInFlight >= 1 {
		o.webhookPerMerch = min(o.webhookPerMerch, o.webhookInFlight)
	}
	switch {
	case o.streamPartitions < 1 || o.streamPartitions > 1024:
		return errors.New("invalid --stream-partitions: must be between 1 and 1024")
	case o.claimIdle < time.Second:
		return errors.New("invalid --claim-idle: must be at least 1s")
	case o.batchSize < 1 || o.batchSize > 10000:
		return errors.New("invalid --consumer-batch-size: must be between 1 and 10000")
	case o.maxAttempts < 1:
		return errors.New("invalid --handler-max-attempts: must be at least 1")
	case o.retryBackoff <= 0 || o.retryBackoffMax < o.retryBackoff:
		return errors.New("invalid --handler-retry-backoff / --handler-retry-backoff-max: positive, and the first at most the second")
	case o.gapTimeout < time.Second:
		return errors.New("invalid --gap-timeout: must be at least 1s")
	case o.webhookTimeout < 100*time.Millisecond || o.webhookTimeout > 5*time.Minute:
		return errors.New("invalid --webhook-timeout: must be between 100ms and 5m")
	case o.webhookInFlight < 1 || o.webhookInFlight > 10000:
		return errors.New("invalid --webhook-concurrency: must be between 1 and 10000")
	case o.webhookPerMerch < 1 || o.webhookPerMerch > o.webhookInFlight:
		return errors.New("invalid --webhook-per-merchant: must be between 1 and --webhook-concurrency")
	}
	return validateRetention("processed-retention", o.retention, time.Hour)
}

// handOverInterval is how often a worker looks for legacy webhook
// deliveries to hand over (handlers.RunHandOver): one indexed read when
// there are none.
const handOverInterval = 2 * time.Second

// buildWorker returns a function that runs the reference consumers, the
// webhook sender and the handover until ctx is done, and the sender's
// Wake (for an API in the same process). Their metrics go to metricsReg (nil: none); it adds the
// database, the broker and the worker's subscriptions to ready.
func buildWorker(ctx context.Context, c config.Config, o *workerOptions, metricsReg prometheus.Registerer, ready *readiness, logger *slog.Logger) (run func(context.Context) error, wakeSender func(), err error) {
	pool, err := openPool(ctx, c.DatabaseURL)
	if err != nil {
		return nil, nil, err
	}
	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		pool.Close()
		return nil, nil, err
	}
	backend, err := brokers.Open(ctx, brokerConfig(c, o.streamPartitions, logger, true)) // the reference app's worker
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	w, err := consumer.NewWorker(consumer.WorkerConfig{
		Pool: pool, Broker: backend, Registry: reg, ClaimIdle: o.claimIdle,
		BatchSize: o.batchSize,
		Idempotency: idempotency.Config{MaxBatch: o.batchSize, MaxAttempts: o.maxAttempts, RetryBackoff: o.retryBackoff,
			RetryBackoffMax: o.retryBackoffMax, GapTimeout: o.gapTimeout},
		Logger: logger, Registerer: metricsReg,
	})
	if err != nil {
		pool.Close()
		backend.Close()
		return nil, nil, err
	}
	// The merchants' webhooks: the webhook package's sender, the flags of
	// the earlier releases' sender mapped onto it (a merchant's requests
	// are its endpoints').
	snd := sender.New(pool, sender.Config{Timeout: o.webhookTimeout, Concurrency: o.webhookInFlight,
		PerEndpoint: o.webhookPerMerch, AllowPrivate: c.WebhookAllowPrivate, SecretKey: c.SecretKey,
		Registerer: metricsReg, Logger: logger})
	// The handler wakes this process's sender once a delivery committed;
	// senders in other processes find it at their next poll.
	notify := handlers.NotifyConfig{Wake: snd.Wake, Logger: logger}
	for _, h := range referenceHandlers(pool, notify) {
		if err := w.Add(h); err != nil {
			pool.Close()
			backend.Close()
			return nil, nil, err
		}
	}
	purge, err := consumerRetention(pool, o.retention, logger)
	if err != nil {
		pool.Close()
		backend.Close()
		return nil, nil, err
	}
	ready.addDatabase(pool)
	ready.addBroker(backend)
	ready.add("worker", func(context.Context) error { return w.Ready() })
	return func(ctx context.Context) error {
		defer pool.Close()
		defer backend.Close()
		sctx, stop := context.WithCancel(ctx)
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			if err := snd.Run(sctx); err != nil {
				logger.Error("webhook sender stopped", "error", err.Error())
			}
		}()
		// Beside the sender, for as long as processes of the earlier
		// release may still record or send legacy deliveries: the ones
		// they left pending move to the webhook package's tables.
		handedOver := make(chan struct{})
		go func() {
			defer close(handedOver)
			if err := handlers.RunHandOver(sctx, pool, handOverInterval, logger); err != nil {
				logger.Error("webhook handover stopped", "error", err.Error())
			}
		}()
		if purge != nil {
			purged := make(chan struct{})
			go func() { defer close(purged); _ = purge(sctx) }()
			defer func() { <-purged }() // after stop(), before pool.Close()
		}
		logger.Info("worker started", "broker", string(c.Broker))
		err := w.Run(ctx)
		stop()
		<-sent
		<-handedOver
		return err
	}, snd.Wake, nil
}

func newWorkerCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run the consumers (SyncAnalytics, NotifyMerchant): idempotent, ordered per aggregate",
		Args:  cobra.NoArgs,
	}
	opts := addWorkerFlags(cmd.Flags(), false)
	var metricsAddr string
	addMetricsAddrFlag(cmd.Flags(), &metricsAddr, DefaultWorkerMetricsAddr, "address serving /metrics, /healthz and /readyz")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := opts.validate(); err != nil {
			return err
		}
		cfg, logger, err := e.load()
		if err != nil {
			return err
		}
		warnPlaintextSecrets(cfg, logger)
		ctx := cmd.Context()
		ready := e.newReadiness()
		reg := newRegistry()
		run, _, err := buildWorker(ctx, cfg, opts, reg, ready, logger)
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

func newDLQCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, retry or discard the consumers' dead letters",
	}
	var (
		consumer string
		limit    int
		asJSON   bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead letters: retrying, dead, and held behind them",
		Args:  cobra.NoArgs,
		RunE: e.withPool(func() error {
			if limit < 1 {
				return errors.New("invalid --limit: must be at least 1")
			}
			return nil
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			dls, err := idempotency.ListDeadLetters(cmd.Context(), pool, consumer, limit)
			if err != nil {
				return err
			}
			if asJSON {
				return printList(cmd, dls)
			}
			if len(dls) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no dead letters")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCONSUMER\tSTATUS\tEVENT\tAGGREGATE\tVERSION\tATTEMPTS\tREASON\tERROR")
			for _, d := range dls {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.ID, d.Consumer, d.Status, d.EventType,
					d.AggregateID, d.AggregateVersion, d.Attempts, d.Reason, d.Error)
			}
			return tw.Flush()
		}),
	}
	list.Flags().StringVar(&consumer, "consumer", "", "only this consumer's")
	list.Flags().IntVar(&limit, "limit", 100, "rows to list")
	list.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of the messages")

	var (
		id  int64
		all bool
	)
	retry := &cobra.Command{
		Use:   "retry",
		Short: "Retry dead messages with a fresh attempt count: --id N or --all",
		Args:  cobra.NoArgs,
		RunE: e.withPool(func() error { return checkIDOrAll(id, all, "a dead message's id (see `outflow dlq list`)") }, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			n, err := e.recorded(cmd, nil, pool, actionlog.Entry{Action: "dlq.retry", Target: idsOrAll(id, all)},
				func(ctx context.Context, tx pgx.Tx) (int64, error) {
					return idempotency.RetryDeadLetter(ctx, tx, "", id)
				})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "released %d dead messages for retry\n", n)
			return nil
		}),
	}
	retry.Flags().Int64Var(&id, "id", 0, "the dead message to retry")
	retry.Flags().BoolVar(&all, "all", false, "retry every dead message")

	var discardID int64
	discard := &cobra.Command{
		Use:   "discard",
		Short: "Give up on a dead message: count it handled and release the events held behind it",
		Args:  cobra.NoArgs,
		RunE: e.withPool(func() error {
			if discardID <= 0 {
				return errors.New("invalid --id: give a dead message's id (see `outflow dlq list`)")
			}
			return nil
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			_, err := e.recorded(cmd, nil, pool, actionlog.Entry{Action: "dlq.discard", Target: idsOrAll(discardID, false)},
				func(ctx context.Context, tx pgx.Tx) (int64, error) {
					return 1, idempotency.DiscardDeadLetter(ctx, tx, discardID)
				})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "discarded %d\n", discardID)
			return nil
		}),
	}
	discard.Flags().Int64Var(&discardID, "id", 0, "the dead message to discard")
	cmd.AddCommand(list, retry, discard)
	return cmd
}
