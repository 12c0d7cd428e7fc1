// Command outflow-bench runs Outflow's benchmarks, each against a baseline
// measured in the same run, in a schema of its own that it drops at the end.
//
//	outflow-bench pay [-ops 6000] [-slices 20] [-clients 1,4,16,64]
//	outflow-bench forward [-backlog 100000] [-rate 1000] [-duration 10s] [-published 1000000] [-only throughput,latency,claim]
//	outflow-bench brokers [-brokers redis,nats,amqp,kafka,sql] [-backlog 20000] [-rate 1000] [-duration 10s]
//	outflow-bench webhooks [-rate 500] [-duration 10s] [-merchants 10] [-slow 10s]
//	outflow-bench webhooks-scale [-accounts 1000] [-rate 200] [-duration 20s] [-failing 0.1] [-per-tx 10] [-producers 4] [-concurrency 64] [-per-endpoint 4] [-suspect-concurrency 16]
//	outflow-bench pipeline [-backlog 60000] [-rate 3000] [-duration 20s] [-producers 16] [-per-tx 1] [-consumer-batch 100] [-only drain,steady]
//	outflow-bench writepath [-ops 2000] [-slices 10] [-clients 1,16,64] [-only notify,ledger]
//	outflow-bench wait [-backlog 50000] [-rounds 5]
//	outflow-bench history [-processed 10000000] [-aggregates 1000000] [-backlog 15000] [-rounds 11]
//	outflow-bench tracing [-pay-ops 3000] [-clients 16] [-backlog 24000] [-rounds 6] [-modes off,on,never]
//	outflow-bench audit [-backlog 50000] [-rounds 3] [-interval 1s] [-lost 20000]
//	outflow-bench event-cost [-retained 0,1000000] [-events 20000] [-clients 8] [-empty-history]
//	outflow-bench claim-cost [-sizes 300,100000] [-events 2000]
//	outflow-bench relay-wal [-events 2000] [-batch-sizes 1,500] [-rate 0]
//	outflow-bench consumer-wal [-payments 10000] [-retained 0,5000000,20000000] [-workers 8]
//	outflow-bench wal-mode [-clients 8,32] [-duration 6s] [-rounds 3] [-backlog 30000] [-max-changes 30000]
//	outflow-bench console [-outbox 1000000] [-processed 10000000] [-dead 100000] [-renders 200]
//
// The database is BENCH_DATABASE_URL, defaulting to the test database.
// BENCH_CPUPROFILE=file.out writes a CPU profile of the benchmark's process
// over each brokers run's steady part, to file-<backend>.out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/cmd/outflow-bench/internal/bench"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "outflow-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: outflow-bench pay|writepath|forward|pipeline|brokers|nats-replicas|history|webhooks|webhooks-scale|footprint|tracing|wait|audit|relay-wal|event-cost|claim-cost|consumer-wal|wal-mode|console [flags]")
	}
	dbURL := os.Getenv("BENCH_DATABASE_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:5432/outflow_test?sslmode=disable"
	}
	switch args[0] {
	case "wal-mode":
		// A PostgreSQL of its own (wal_level=logical, fsync on): not
		// BENCH_DATABASE_URL.
		fs := flag.NewFlagSet("wal-mode", flag.ContinueOnError)
		clients := fs.String("clients", "8,32", "comma-separated producer concurrency levels")
		duration := fs.Duration("duration", 6*time.Second, "each variant's time per level")
		rounds := fs.Int("rounds", 3, "rotating slices the duration is split into")
		backlog := fs.Int("backlog", 30000, "events each mode's drain starts from")
		maxChanges := fs.Int("max-changes", 0, "the relay's changes per read (0: its default, 30000)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		levels, err := parseInts(*clients)
		if err != nil {
			return fmt.Errorf("invalid -clients: %w", err)
		}
		return bench.WALMode(ctx, bench.WALModeConfig{Clients: levels, Duration: *duration, Rounds: *rounds, Backlog: *backlog, MaxChanges: *maxChanges, Out: os.Stdout})
	case "pay":
		fs := flag.NewFlagSet("pay", flag.ContinueOnError)
		ops := fs.Int("ops", 6000, "pay commands per variant and concurrency level")
		slices := fs.Int("slices", 20, "alternating slices the ops are split into")
		clients := fs.String("clients", "1,4,16,64", "comma-separated concurrency levels")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		levels, err := parseInts(*clients)
		if err != nil {
			return fmt.Errorf("invalid -clients: %w", err)
		}
		pool, drop, err := bench.Schema(ctx, dbURL, int32(maxOf(levels)+2))
		if err != nil {
			return err
		}
		defer drop()
		return bench.Pay(ctx, bench.PayConfig{Pool: pool, Clients: levels, Ops: *ops, Slices: *slices, Out: os.Stdout})
	case "writepath":
		fs := flag.NewFlagSet("writepath", flag.ContinueOnError)
		ops := fs.Int("ops", 2000, "commands per variant and concurrency level")
		slices := fs.Int("slices", 10, "rotating slices the ops are split into")
		clients := fs.String("clients", "1,16,64", "comma-separated concurrency levels")
		only := fs.String("only", "", "comma-separated substrings of the variants to run besides the references (default all)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		levels, err := parseInts(*clients)
		if err != nil {
			return fmt.Errorf("invalid -clients: %w", err)
		}
		if *ops < 1 || *slices < 1 || *slices > *ops {
			return fmt.Errorf("invalid -ops or -slices: must be positive, with -slices at most -ops")
		}
		return bench.WritePath(ctx, bench.WritePathConfig{DatabaseURL: dbURL, Clients: levels, Ops: *ops, Slices: *slices,
			Only: splitNonEmpty(*only), Out: os.Stdout})
	case "forward":
		fs := flag.NewFlagSet("forward", flag.ContinueOnError)
		backlog := fs.Int("backlog", 100_000, "rows each throughput contender drains")
		rate := fs.Int("rate", 1000, "events per second in the latency run")
		dur := fs.Duration("duration", 10*time.Second, "length of the latency run")
		published := fs.Int("published", 1_000_000, "published rows kept in the claim-cost run")
		only := fs.String("only", "", "comma-separated parts to run: throughput, latency, claim (default all)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		opts, err := redis.ParseURL(redisURL())
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		return bench.Forward(ctx, bench.ForwardConfig{DatabaseURL: dbURL, Redis: rdb, Backlog: *backlog, Rate: *rate,
			Duration: *dur, Published: *published, Only: splitNonEmpty(*only), Out: os.Stdout})
	case "event-cost":
		fs := flag.NewFlagSet("event-cost", flag.ContinueOnError)
		retained := fs.String("retained", "0,1000000", "comma-separated rows retained before each run")
		events := fs.Int("events", 20000, "events each run writes, relays and retires")
		clients := fs.Int("clients", 8, "concurrent writers")
		empty := fs.Bool("empty-history", false, "seed the retained rows with an empty payload (a reduced form for 100M rows)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		r, err := parseCounts(*retained)
		if err != nil {
			return fmt.Errorf("-retained: %w", err)
		}
		return bench.EventCost(ctx, bench.EventCostConfig{DatabaseURL: dbURL, Retained: r, EmptyHistory: *empty,
			Events: *events, Clients: *clients, Out: os.Stdout})
	case "claim-cost":
		fs := flag.NewFlagSet("claim-cost", flag.ContinueOnError)
		sizes := fs.String("sizes", "300,100000", "comma-separated payload sizes, in bytes")
		events := fs.Int("events", 2000, "events each run writes and retires")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		s, err := parseInts(*sizes)
		if err != nil {
			return fmt.Errorf("-sizes: %w", err)
		}
		return bench.ClaimCost(ctx, bench.ClaimCostConfig{DatabaseURL: dbURL, Sizes: s, Events: *events, Out: os.Stdout})
	case "relay-wal":
		fs := flag.NewFlagSet("relay-wal", flag.ContinueOnError)
		events := fs.Int("events", 2000, "rows each run forwards")
		batches := fs.String("batch-sizes", "1,500", "comma-separated forwarder batch sizes")
		rate := fs.Float64("rate", 0, "events a second written while the relay runs, one per transaction (0: a seeded backlog, one run per batch size)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		sizes, err := parseInts(*batches)
		if err != nil {
			return err
		}
		if *rate < 0 {
			return fmt.Errorf("-rate: must not be negative")
		}
		return bench.RelayWAL(ctx, bench.RelayWALConfig{DatabaseURL: dbURL, Events: *events, BatchSizes: sizes, Rate: *rate, Out: os.Stdout})
	case "consumer-wal":
		fs := flag.NewFlagSet("consumer-wal", flag.ContinueOnError)
		payments := fs.Int("payments", 10_000, "payments each run handles (2.2 events a payment)")
		retained := fs.String("retained", "0,5000000,20000000", "comma-separated version rows retained before a run, one run each")
		workers := fs.Int("workers", 8, "goroutines delivering the events")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		counts, err := parseCounts(*retained)
		if err != nil {
			return err
		}
		return bench.ConsumerWAL(ctx, bench.ConsumerWALConfig{DatabaseURL: dbURL, Payments: *payments, Retained: counts,
			Workers: *workers, Out: os.Stdout})
	case "audit":
		fs := flag.NewFlagSet("audit", flag.ContinueOnError)
		backlog := fs.Int("backlog", 50_000, "rows each throughput run drains")
		rounds := fs.Int("rounds", 3, "drains per side (audit off, on), alternating")
		interval := fs.Duration("interval", time.Second, "audit interval of the throughput runs")
		lost := fs.Int("lost", 20_000, "published rows the loss runs lose and repair")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return bench.Audit(ctx, bench.AuditConfig{DatabaseURL: dbURL, Backlog: *backlog, Rounds: *rounds, Interval: *interval, Lost: *lost, Out: os.Stdout})
	case "nats-replicas":
		return bench.NATSReplicas(ctx, bench.NATSReplicasConfig{DatabaseURL: dbURL, Out: os.Stdout})
	case "brokers":
		fs := flag.NewFlagSet("brokers", flag.ContinueOnError)
		list := fs.String("brokers", "redis,nats,amqp,kafka,sql", "comma-separated backends to run (kafka: KAFKA_BROKERS, else an in-process kfake)")
		backlog := fs.Int("backlog", 20_000, "events each drain moves")
		rate := fs.Int("rate", 1000, "events per second in each latency run")
		dur := fs.Duration("duration", 10*time.Second, "length of each latency run")
		warmup := fs.Duration("warmup", 2*time.Second, "how long each latency run produces at -rate before the events it measures (its p99 is reported apart)")
		ce := fs.Bool("cloudevents", true, "write the CloudEvents attributes on each message (false: Outflow's metadata only)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		var cfgs []brokers.Config
		for _, name := range splitNonEmpty(*list) {
			kind, err := brokers.ParseKind(name)
			if err != nil {
				return fmt.Errorf("invalid -brokers: %w", err)
			}
			cfgs = append(cfgs, brokers.Config{Kind: kind, Redis: brokers.RedisConfig{URL: redisURL()},
				NATS:        brokers.NATSConfig{URL: envOr("NATS_URL", "nats://127.0.0.1:4222")},
				AMQP:        brokers.AMQPConfig{URL: envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")},
				Kafka:       brokers.KafkaConfig{Brokers: splitNonEmpty(os.Getenv("KAFKA_BROKERS"))}, // none: kfake in-process
				CloudEvents: cloudevents.Config{Disabled: !*ce}})
		}
		if *backlog < 1 || *rate < 1 || *dur <= 0 {
			return fmt.Errorf("invalid -backlog, -rate or -duration: must be positive")
		}
		if *warmup < 0 {
			return fmt.Errorf("invalid -warmup: must not be negative")
		}
		return bench.Brokers(ctx, bench.BrokersConfig{DatabaseURL: dbURL, Brokers: cfgs, Backlog: *backlog, Rate: *rate,
			Duration: *dur, Warmup: *warmup, Out: os.Stdout})
	case "pipeline":
		fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
		backlog := fs.Int("backlog", 60_000, "events each drain variant moves end to end")
		rate := fs.Int("rate", 3000, "events per second offered in the steady run")
		dur := fs.Duration("duration", 20*time.Second, "length of the steady run")
		producers := fs.Int("producers", 16, "goroutines committing the steady run's events")
		only := fs.String("only", "", "comma-separated parts to run: drain, steady (default both)")
		consumerBatch := fs.Int("consumer-batch", 100, "the steady worker's read and shared-transaction size")
		perTx := fs.Int("per-tx", 1, "events of distinct payments per producer transaction in the steady run")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *backlog < 1 || *rate < 1 || *dur <= 0 || *producers < 1 {
			return fmt.Errorf("invalid -backlog, -rate, -duration or -producers: must be positive")
		}
		return bench.Pipeline(ctx, bench.PipelineConfig{DatabaseURL: dbURL, RedisURL: redisURL(), Backlog: *backlog,
			Rate: *rate, Duration: *dur, Producers: *producers, PerTx: *perTx, ConsumerBatch: *consumerBatch, Only: splitNonEmpty(*only), Out: os.Stdout})
	case "history":
		fs := flag.NewFlagSet("history", flag.ContinueOnError)
		processed := fs.Int("processed", 10_000_000, "rows seeded in processed_messages")
		aggregates := fs.Int("aggregates", 1_000_000, "rows seeded in consumer_aggregate_versions")
		backlog := fs.Int("backlog", 15_000, "events each drain moves (payments of three events)")
		rounds := fs.Int("rounds", 11, "drains per schema, alternating which goes first; the median ratio of the rounds is the result")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		switch {
		case *processed < 0 || *aggregates < 0:
			return fmt.Errorf("invalid -processed or -aggregates: must not be negative")
		case *backlog < 3:
			return fmt.Errorf("invalid -backlog: must be at least 3 (one payment)")
		case *rounds < 1:
			return fmt.Errorf("invalid -rounds: must be positive")
		}
		return bench.History(ctx, bench.HistoryConfig{DatabaseURL: dbURL, RedisURL: redisURL(), Processed: *processed,
			Aggregates: *aggregates, Backlog: *backlog, Rounds: *rounds, Out: os.Stdout})
	case "console":
		fs := flag.NewFlagSet("console", flag.ContinueOnError)
		outboxRows := fs.Int("outbox", bench.DefaultConsoleOutbox, "outbox rows seeded (payments of four events)")
		processed := fs.Int("processed", bench.DefaultConsoleProcessed, "processed_messages rows seeded")
		dead := fs.Int("dead", bench.DefaultConsoleDead, "dead letters seeded")
		renders := fs.Int("renders", bench.DefaultConsoleRenders, "renders measured per page, after 10 unmeasured")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return bench.Console(ctx, bench.ConsoleConfig{DatabaseURL: dbURL, Outbox: *outboxRows, Processed: *processed,
			Dead: *dead, Renders: *renders, Warmup: 10, Out: os.Stdout})
	case "wait":
		return bench.WaitCommand(ctx, dbURL, args[1:], os.Stdout)
	case "footprint":
		fs := flag.NewFlagSet("footprint", flag.ContinueOnError)
		runs := fs.Int("runs", 10, "starts of each service")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *runs < 1 {
			return fmt.Errorf("invalid -runs: must be positive")
		}
		redisURL := os.Getenv("REDIS_URL")
		if redisURL == "" {
			redisURL = "redis://127.0.0.1:6379/0"
		}
		return bench.Footprint(ctx, bench.FootprintConfig{DatabaseURL: dbURL, RedisURL: redisURL, Runs: *runs, Out: os.Stdout})
	case "tracing":
		fs := flag.NewFlagSet("tracing", flag.ContinueOnError)
		payOps := fs.Int("pay-ops", 3000, "pay requests per mode, over all rounds")
		clients := fs.Int("clients", 16, "HTTP clients sending the pay requests at once")
		backlog := fs.Int("backlog", 24_000, "events per mode drained end to end, over all rounds")
		rounds := fs.Int("rounds", 6, "rounds, each running every mode once, the order rotated from one to the next")
		modes := fs.String("modes", strings.Join(bench.TracingModes, ","), "comma-separated modes: off (the baseline, always run), on (AlwaysSample, OTLP/HTTP), never (NeverSample)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *payOps < 1 || *clients < 1 || *backlog < 1 || *rounds < 1 {
			return fmt.Errorf("invalid -pay-ops, -clients, -backlog or -rounds: must be positive")
		}
		return bench.Tracing(ctx, bench.TracingConfig{DatabaseURL: dbURL, RedisURL: redisURL(), PayOps: *payOps, Clients: *clients,
			Backlog: *backlog, Rounds: *rounds, Modes: splitNonEmpty(*modes), Out: os.Stdout})
	case "webhooks":
		fs := flag.NewFlagSet("webhooks", flag.ContinueOnError)
		rate := fs.Int("rate", 500, "deliveries recorded per second")
		dur := fs.Duration("duration", 10*time.Second, "length of each run")
		merchants := fs.Int("merchants", 10, "merchants sharing the rate")
		slow := fs.Duration("slow", 10*time.Second, "how long the slow merchant takes to answer in the last run")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		switch {
		case *rate < 1:
			return fmt.Errorf("invalid -rate: must be positive")
		case *dur <= 0:
			return fmt.Errorf("invalid -duration: must be positive")
		case *merchants < 2:
			return fmt.Errorf("invalid -merchants: must be at least 2 (one slow, the others measured)")
		case *slow <= 0:
			return fmt.Errorf("invalid -slow: must be positive")
		}
		return bench.Webhooks(ctx, bench.WebhooksConfig{DatabaseURL: dbURL, Rate: *rate, Duration: *dur, Merchants: *merchants,
			SlowDelay: *slow, Out: os.Stdout})
	case "webhooks-wal":
		fs := flag.NewFlagSet("webhooks-wal", flag.ContinueOnError)
		accounts := fs.Int("accounts", 1000, "accounts, each with two endpoints")
		n := fs.Int("events", 10_000, "events recorded and delivered")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *accounts < 1 || *n < 1 {
			return fmt.Errorf("invalid -accounts or -events: must be positive")
		}
		return bench.WebhooksWAL(ctx, bench.WebhooksWALConfig{DatabaseURL: dbURL, Accounts: *accounts, Events: *n, Out: os.Stdout})
	case "webhooks-scale":
		// The defaults are scaled down to run in about a minute on 2 cores;
		// the numbers: -accounts 10000 -rate 2000 -duration 60s.
		fs := flag.NewFlagSet("webhooks-scale", flag.ContinueOnError)
		accounts := fs.Int("accounts", 1000, "accounts, each with -endpoints endpoints")
		perAccount := fs.Int("endpoints", 2, "endpoints per account")
		rate := fs.Int("rate", 200, "events offered per second (one delivery per endpoint of the event's account)")
		dur := fs.Duration("duration", 20*time.Second, "how long each run offers events")
		perTx := fs.Int("per-tx", 10, "most events recorded per transaction, as a consumer's shared transaction (a 10 ms tick's events are split in such transactions)")
		producers := fs.Int("producers", 4, "goroutines committing those transactions")
		failing := fs.Float64("failing", 0.1, "fraction of endpoints failing in the second run: half answer 500, half after -slow")
		slow := fs.Duration("slow", 10*time.Second, "how long a slow endpoint takes to answer")
		drain := fs.Duration("drain", 30*time.Second, "longest wait after a run for the healthy deliveries still on their way")
		concurrency := fs.Int("concurrency", sender.DefaultConcurrency, "the Sender's Concurrency")
		perEndpoint := fs.Int("per-endpoint", sender.DefaultPerEndpoint, "the Sender's PerEndpoint")
		suspect := fs.Int("suspect-concurrency", sender.DefaultConcurrency/4, "the Sender's SuspectConcurrency")
		timeout := fs.Duration("timeout", sender.DefaultTimeout, "the Sender's Timeout")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		switch {
		case *accounts < 1 || *perAccount < 1 || *rate < 1 || *perTx < 1 || *producers < 1:
			return fmt.Errorf("invalid -accounts, -endpoints, -rate, -per-tx or -producers: must be positive")
		case *dur <= 0 || *slow <= 0 || *drain < 0 || *timeout <= 0:
			return fmt.Errorf("invalid -duration, -slow, -drain or -timeout: must be positive")
		case *failing < 0 || *failing >= 1:
			return fmt.Errorf("invalid -failing: must be in [0, 1)")
		case *concurrency < 1 || *perEndpoint < 1 || *suspect < 1:
			return fmt.Errorf("invalid -concurrency, -per-endpoint or -suspect-concurrency: must be positive")
		}
		return bench.WebhooksScale(ctx, bench.WebhooksScaleConfig{DatabaseURL: dbURL, Accounts: *accounts,
			EndpointsPerAccount: *perAccount, Rate: *rate, Duration: *dur, PerTx: *perTx, Producers: *producers, Failing: *failing,
			SlowDelay: *slow, Drain: *drain, Out: os.Stdout,
			Sender: sender.Config{Concurrency: *concurrency, PerEndpoint: *perEndpoint, SuspectConcurrency: *suspect,
				Timeout: *timeout}})
	default:
		return fmt.Errorf("unknown benchmark %q (known: pay, writepath, forward, pipeline, brokers, nats-replicas, history, wait, webhooks, webhooks-scale, webhooks-wal, footprint, tracing, audit, relay-wal, event-cost, console)", args[0])
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func redisURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseCounts parses comma-separated non-negative integers.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a non-negative integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func maxOf(xs []int) int {
	m := xs[0]
	for _, x := range xs[1:] {
		m = max(m, x)
	}
	return m
}

func splitNonEmpty(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
