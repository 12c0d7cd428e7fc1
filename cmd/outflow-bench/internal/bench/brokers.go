package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/all" // the benchmarks run on every backend
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
)

// BrokersConfig configures [Brokers].
type BrokersConfig struct {
	DatabaseURL string
	// Brokers are the backends to run, each with its configuration block
	// (URLs); Kind and prefixes are set per run.
	Brokers []brokers.Config
	// Backlog is how many events each drain moves.
	Backlog int
	// Rate and Duration shape each latency run: events per second, one per
	// transaction.
	Rate     int
	Duration time.Duration
	// Warmup is how long the producers run at Rate before Duration's
	// events, which alone make the steady quantiles: the first second
	// after the drain pays for the producers' new connections (a backend
	// forked and its caches filled, on the cores the pipeline runs on)
	// and for the forwarder's idle poll, which a service committing 1,000
	// events/s does not. The warm-up's own p99 is reported beside them.
	Warmup time.Duration
	Out    io.Writer
}

// Brokers runs the same pipeline (outbox, forwarder, broker, SyncAnalytics
// behind the middleware, default settings) on each backend, back to back:
// the drain rate of a backlog, then commit-to-handled latency at a steady
// rate.
func Brokers(ctx context.Context, cfg BrokersConfig) error {
	fmt.Fprintf(cfg.Out, "brokers: the same pipeline on each backend (drain %d events; then %d events/s for %s after %s of warm-up, one per transaction)\n\n",
		cfg.Backlog, cfg.Rate, cfg.Duration, cfg.Warmup)
	fmt.Fprintf(cfg.Out, "| backend | drain events/s | steady: handled/s | p50 ms | p99 ms | max ms | held as gaps | their wait p50 / p99 / max ms | p99 ms of the others | p99 ms: commit / to the publish / publish / to the worker / in it | p99 ms from the commit's return | warm-up p99 / max ms | CPU µs an event: postgres / bench / broker | machine busy |\n"+
		"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, bc := range cfg.Brokers {
		name := string(bc.Kind)
		if bc.Kind == brokers.Kafka && len(bc.Kafka.Brokers) == 0 {
			// No Kafka here: franz-go's in-process fake speaks its
			// protocol (no replication, no disk), so this row measures the
			// client path, not a Kafka cluster.
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
			if err != nil {
				return fmt.Errorf("start kfake: %w", err)
			}
			bc.Kafka.Brokers = c.ListenAddrs()
			defer c.Close()
			name = "kafka (kfake, in-process)"
		}
		r, err := brokerRun(ctx, cfg, bc)
		if err != nil {
			fmt.Fprintf(cfg.Out, "| %s | failed: %s | | | | | | | | | | | | |\n", name, strings.ReplaceAll(err.Error(), "|", "/"))
			continue
		}
		fmt.Fprintf(cfg.Out, "| %s | %.0f | %.0f | %.1f | %.1f | %.1f | %d | %.1f / %.1f / %.1f | %.1f | %s | %.1f | %.1f / %.1f | %s | %s |\n", name, r.drain, r.steady,
			r.p50, r.p99, r.max, r.held, r.heldP50, r.heldP99, r.heldMax, r.p99Others, r.stages, r.stages.fromCommit, r.warmP99, r.warmMax, r.cpu, r.busy)
	}
	fmt.Fprintln(cfg.Out)
	return nil
}

type brokerResult struct {
	drain, steady, p50, p99, max float64
	// The steady run's events held as gaps (they arrived before their
	// predecessor was applied): how many, how long each waited from being
	// held to being applied, and the p99 of the events never held, so a
	// regression of the tail says whether the gaps are its cause.
	held                      int
	heldP50, heldP99, heldMax float64
	p99Others                 float64
	// The steady events' p99 split in five (stageP99s).
	stages stageP99s
	// The warm-up's events: commit-to-handled p99 and max.
	warmP99, warmMax float64
	// From the end of the warm-up to the last event handled: the CPU
	// time per event of PostgreSQL, the benchmark's process and the
	// broker's (cpuPerEvent), and how busy the machine was.
	cpu, busy string
}

func brokerRun(ctx context.Context, cfg BrokersConfig, bc brokers.Config) (brokerResult, error) {
	var res brokerResult
	pool, dropSchema, err := Schema(ctx, cfg.DatabaseURL, 24)
	if err != nil {
		return res, err
	}
	defer dropSchema()
	// Names of this run's own: a topic no other run uses.
	topic := "bench_" + uuid.NewString()[:8]
	bc.Logger = quietLogger()
	if bc.Kind == brokers.SQL && bc.SQL.DatabaseURL == "" {
		// The run's schema: its tables go with it.
		bc.SQL.DatabaseURL = pool.Config().ConnString()
	}
	backend, err := brokers.Open(ctx, bc)
	if err != nil {
		return res, err
	}
	defer backend.Close()
	if err := seedPayments(ctx, pool, topic, cfg.Backlog); err != nil {
		return res, err
	}
	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		return res, err
	}
	clock := newStageClock()
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: timed(backend.Broker(), clock), Logger: quietLogger()})
	if err != nil {
		return res, err
	}
	acks := &ackTimes{at: map[string]time.Time{}}
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg, Logger: quietLogger(),
		Middleware: []message.HandlerMiddleware{acks.middleware}})
	if err != nil {
		return res, err
	}
	h := handlers.SyncAnalytics()
	h.Topic = topic
	if err := w.Add(h); err != nil {
		return res, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	start := time.Now()
	wg.Go(func() { _ = f.Run(rctx) })
	wg.Go(func() { _ = w.Run(rctx) })
	handled := func(ctx context.Context) (int, error) { return countHandled(ctx, pool) }
	if err := waitHandled(ctx, cfg.Backlog, 10*time.Minute, handled); err != nil {
		return res, err
	}
	res.drain = float64(cfg.Backlog) / time.Since(start).Seconds()
	var seededMax int64
	if err := pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&seededMax); err != nil {
		return res, err
	}

	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	if err != nil {
		return res, err
	}
	total := int((cfg.Warmup + cfg.Duration).Seconds() * float64(cfg.Rate))
	// A payment's events are committed in order, by one producer (as an
	// application does: it writes version 2 after reading version 1);
	// payments spread over the producers.
	const producers = 8
	jobs := make([]chan int, producers)
	var (
		pwg     sync.WaitGroup
		prodErr atomic.Value
	)
	for p := range jobs {
		jobs[p] = make(chan int, cfg.Rate)
		pwg.Go(func() {
			for i := range jobs[p] {
				// Payments of their own, three events each, as in Pipeline.
				pay, v := 1_000_000+i/3, int64(i%3+1)
				ev, err := events.New(ctx, events.Aggregate{Type: paymentevents.AggregateType, ID: fmt.Sprintf("pay-%d", pay), Version: v},
					benchPayment(pay, v))
				if err == nil {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writer.PublishTx(ctx, tx, ev) })
				}
				if err == nil {
					clock.commit(ev.MessageID)
				}
				if err != nil {
					prodErr.Store(err)
				}
			}
		})
	}
	sstart := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(cfg.Rate))
	warmEvents := int(cfg.Warmup.Seconds() * float64(cfg.Rate))
	var (
		cpuFrom cpuSample
		profErr error
	)
	stopProfile := func() {}
	defer func() { stopProfile() }()
	for i := range total {
		if i == warmEvents {
			cpuFrom = sampleCPU(brokerProcess[bc.Kind])
			// On an error, the producers are still stopped below.
			if stopProfile, profErr = startProfile(string(bc.Kind)); profErr != nil {
				break
			}
		}
		<-tick.C
		jobs[(i/3)%producers] <- i
	}
	tick.Stop()
	for _, j := range jobs {
		close(j)
	}
	pwg.Wait()
	if profErr != nil {
		return res, profErr
	}
	if e, ok := prodErr.Load().(error); ok {
		return res, fmt.Errorf("produce: %w", e)
	}
	if err := waitHandled(ctx, cfg.Backlog+total, 5*time.Minute, handled); err != nil {
		return res, err
	}
	res.steady = float64(total) / time.Since(sstart).Seconds()
	cpuTo := sampleCPU(brokerProcess[bc.Kind])
	stopProfile()
	res.cpu, res.busy = cpuPerEvent(cpuFrom, cpuTo, total-warmEvents), machineBusy(cpuFrom, cpuTo)
	measured := window{afterID: seededMax, from: sstart.Add(cfg.Warmup)}
	if err := checkProjection(ctx, pool, cfg.Backlog+total); err != nil {
		return res, err
	}
	// From the worker's acknowledgement, or the resolution of an event
	// held as a gap.
	res.p50, res.p99, res.max, err = acks.latencies(ctx, pool, measured)
	if err != nil {
		return res, err
	}
	if cfg.Warmup > 0 {
		if _, res.warmP99, res.warmMax, err = acks.latencies(ctx, pool, window{afterID: seededMax, to: measured.from}); err != nil {
			return res, err
		}
	}
	if err := pool.QueryRow(ctx, `
		SELECT count(*), coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY w), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY w), 0), coalesce(max(w), 0)
		FROM (SELECT extract(epoch FROM d.resolved_at - d.created_at) * 1000 AS w
		      FROM dead_letters d JOIN outbox o ON o.message_id = d.message_id
		      WHERE o.id > $1 AND d.reason = 'gap' AND d.status = 'resolved'`+measured.createdFilter("o.created_at")+`) g`, measured.args()...).
		Scan(&res.held, &res.heldP50, &res.heldP99, &res.heldMax); err != nil {
		return res, fmt.Errorf("held events: %w", err)
	}
	others, err := neverHeld(ctx, pool, measured)
	if err != nil {
		return res, err
	}
	res.p99Others, res.stages = acks.p99NeverHeld(others), clock.stages(acks, others)
	return res, nil
}
