package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/app/paymentevents"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
)

// TracingModes are the modes [Tracing] knows, in their default order.
var TracingModes = []string{"off", "on", "never"}

// TracingConfig configures [Tracing].
type TracingConfig struct {
	DatabaseURL string
	RedisURL    string
	// PayOps is how many pay requests each mode serves, over all rounds.
	// Defaults to 3000.
	PayOps int
	// Clients is how many HTTP clients send the pay requests at once.
	// Defaults to 16.
	Clients int
	// Backlog is how many events each mode drains end to end, over all
	// rounds. Defaults to 24000.
	Backlog int
	// Rounds splits each mode's work into rounds; every round runs each
	// mode once, the order rotated from one round to the next. Defaults
	// to 6.
	Rounds int
	// Modes lists the modes to run, among [TracingModes]; "off" is the
	// baseline and always runs. Defaults to all.
	Modes []string
	Out   io.Writer
}

func (c *TracingConfig) defaults() error {
	if c.PayOps == 0 {
		c.PayOps = 3000
	}
	if c.Clients == 0 {
		c.Clients = 16
	}
	if c.Backlog == 0 {
		c.Backlog = 24000
	}
	if c.Rounds == 0 {
		c.Rounds = 6
	}
	if len(c.Modes) == 0 {
		c.Modes = TracingModes
	}
	if c.PayOps < 0 || c.Clients < 0 || c.Backlog < 0 || c.Rounds < 0 {
		return errors.New("tracing bench: sizes must be positive")
	}
	if c.PayOps < c.Rounds || c.Backlog < 3*c.Rounds {
		return fmt.Errorf("tracing bench: -pay-ops must be at least -rounds and -backlog at least 3 x -rounds")
	}
	modes := []string{"off"}
	for _, m := range c.Modes {
		if !slices.Contains(TracingModes, m) {
			return fmt.Errorf("tracing bench: unknown mode %q (known: %v)", m, TracingModes)
		}
		if !slices.Contains(modes, m) {
			modes = append(modes, m)
		}
	}
	c.Modes = modes
	return nil
}

// Tracing measures what tracing costs the pay request (HTTP API -> service
// transaction -> outbox) and the pipeline drain (outbox -> forwarder ->
// Redis Streams -> SyncAnalytics behind the idempotency middleware), against
// tracing off, in one run. Modes:
//
//   - off: no TracerProvider, the default (every span a no-op);
//   - on: the SDK with AlwaysSample, the BatchSpanProcessor with its
//     defaults, and the real OTLP/HTTP exporter sending every span to a
//     receiver this benchmark serves on loopback;
//   - never: the same provider with NeverSample, i.e. the instrumentation
//     with nothing recorded.
//
// Each mode's work is split into rounds that rotate the order of the
// modes, so drift on a loaded machine falls on all of them alike.
func Tracing(ctx context.Context, cfg TracingConfig) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	out := cfg.Out
	recv := &otlpReceiver{}
	if err := recv.Start(); err != nil {
		return err
	}
	defer recv.Close()

	// The first "off" run sees the process as it starts: nothing set.
	// otel cannot unset a provider, so later "off" runs use the noop one
	// (equally nothing recorded, the same calls): see the tracing
	// package's BenchmarkInstrumentation for both, in ns.
	payOps, drainN := cfg.PayOps/cfg.Rounds, cfg.Backlog/cfg.Rounds
	fmt.Fprintf(out, "tracing: modes %v, %d rounds rotating the order; pay: %d requests per mode over HTTP, %d clients; "+
		"drain: %d events per mode end to end\nOTLP/HTTP receiver at %s\n\n",
		cfg.Modes, cfg.Rounds, payOps*cfg.Rounds, cfg.Clients, drainN*cfg.Rounds, recv.URL())

	pb, err := newPayBench(ctx, cfg)
	if err != nil {
		return err
	}
	defer pb.Close()
	pb.Start()

	type result struct {
		pay                  []sample
		drainEvents          int
		drainTime            time.Duration
		drainRates           []float64
		paySpans, drainSpans spanCounts
		payCPU, drainCPU     time.Duration
	}
	res := make(map[string]*result, len(cfg.Modes))
	for _, m := range cfg.Modes {
		res[m] = &result{}
	}
	// Warm-up, not measured: connections to the API and the database, and
	// the statements' plans.
	if _, _, _, err := pb.run(ctx, "off", recv, min(payOps, 200)); err != nil {
		return fmt.Errorf("pay warm-up: %w", err)
	}
	for round := range cfg.Rounds {
		// Rotated, so each mode takes each place in turn (with two modes:
		// AB, BA, ...).
		k := round % len(cfg.Modes)
		order := append(slices.Clone(cfg.Modes[k:]), cfg.Modes[:k]...)
		for _, m := range order {
			r := res[m]
			s, spans, cpu, err := pb.run(ctx, m, recv, payOps)
			if err != nil {
				return fmt.Errorf("pay, tracing %s: %w", m, err)
			}
			r.pay = append(r.pay, s)
			r.paySpans.add(spans)
			r.payCPU += cpu
			d, err := tracedDrain(ctx, cfg, m, recv, drainN)
			if err != nil {
				return fmt.Errorf("drain, tracing %s: %w", m, err)
			}
			r.drainEvents += drainN
			r.drainTime += d.elapsed
			r.drainRates = append(r.drainRates, float64(drainN)/d.elapsed.Seconds())
			r.drainSpans.add(d.spans)
			r.drainCPU += d.cpu
		}
		fmt.Fprintf(out, "round %d of %d done (%v)\n", round+1, cfg.Rounds, order)
	}

	// Every "on" request's outbox row carries the context of its recorded
	// (sampled) server span: otherwise the run did not trace what it says.
	sampled, err := pb.sampledRows(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(cfg.Modes, "on") && sampled != payOps*cfg.Rounds {
		return fmt.Errorf("%d outbox rows carry a sampled traceparent, want %d (one per pay request with tracing on)", sampled, payOps*cfg.Rounds)
	}

	fmt.Fprintf(out, "\npay (POST /v1/payments/{id}/pay, %d clients):\n\n", cfg.Clients)
	fmt.Fprintf(out, "| tracing | tx/s | p50 ms | p99 ms | tx/s vs off | median of rounds | p50 vs off | p99 vs off | CPU µs/request | vs off | spans ended / received |\n")
	fmt.Fprintf(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	perOp := func(cpu time.Duration, n int) float64 { return float64(cpu.Microseconds()) / float64(n) }
	totalPay := payOps * cfg.Rounds
	baseCPU := perOp(res["off"].payCPU, totalPay)
	base := summarize(res["off"].pay)
	payRate := func(s sample) float64 { return float64(len(s.latencies)) / s.elapsed.Seconds() }
	for _, m := range cfg.Modes {
		st := summarize(res[m].pay)
		ratios := make([]float64, cfg.Rounds)
		for i := range ratios {
			ratios[i] = payRate(res[m].pay[i]) / payRate(res["off"].pay[i])
		}
		cpu := perOp(res[m].payCPU, totalPay)
		fmt.Fprintf(out, "| %s | %.0f | %.3f | %.3f | %.2fx | %.2fx | %.2fx | %.2fx | %.0f | %.2fx | %s |\n", modeLabel(m), st.tps, ms(st.p50), ms(st.p99),
			st.tps/base.tps, median(ratios), ms(st.p50)/ms(base.p50), ms(st.p99)/ms(base.p99), cpu, cpu/baseCPU, res[m].paySpans)
	}
	fmt.Fprintf(out, "\ndrain (outbox -> forwarder -> Redis Streams -> SyncAnalytics, default worker):\n\n")
	fmt.Fprintf(out, "| tracing | events/s end to end | vs off | median of rounds | per round | CPU µs/event | vs off | spans ended / received |\n")
	fmt.Fprintf(out, "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n")
	baseRate := float64(res["off"].drainEvents) / res["off"].drainTime.Seconds()
	baseCPU = perOp(res["off"].drainCPU, res["off"].drainEvents)
	for _, m := range cfg.Modes {
		r := res[m]
		rate := float64(r.drainEvents) / r.drainTime.Seconds()
		rounds := make([]string, len(r.drainRates))
		ratios := make([]float64, len(r.drainRates))
		for i, x := range r.drainRates {
			rounds[i] = fmt.Sprintf("%.0f", x)
			ratios[i] = x / res["off"].drainRates[i]
		}
		cpu := perOp(r.drainCPU, r.drainEvents)
		fmt.Fprintf(out, "| %s | %.0f | %.2fx | %.2fx | %s | %.0f | %.2fx | %s |\n", modeLabel(m), rate, rate/baseRate, median(ratios),
			strings.Join(rounds, " "), cpu, cpu/baseCPU, r.drainSpans)
	}
	fmt.Fprintf(out, "\nOTLP receiver: %d spans in %d requests, %.1f MiB of protobuf, %.2f s handling them (left out of CPU µs)\n"+
		"CPU: this process's (API, service, forwarder, worker, exporter; not PostgreSQL's or Redis's), from the start of a run to its spans exported\n\n",
		recv.spans.Load(), recv.requests.Load(), float64(recv.bytes.Load())/(1<<20), recv.busy().Seconds())
	if slices.Contains(cfg.Modes, "on") {
		if res["on"].paySpans.received == 0 || res["on"].drainSpans.received == 0 {
			return fmt.Errorf("the OTLP receiver got no spans with tracing on (pay %d, drain %d)", res["on"].paySpans.received, res["on"].drainSpans.received)
		}
	}
	// Spans the batch processor dropped (its queue full) were not
	// exported: the run would understate the cost.
	for _, m := range cfg.Modes {
		for _, c := range []spanCounts{res[m].paySpans, res[m].drainSpans} {
			if c.received != c.ended {
				return fmt.Errorf("tracing %s: %d spans ended, the OTLP receiver got %d (the batch processor dropped some: OTEL_BSP_MAX_QUEUE_SIZE)",
					m, c.ended, c.received)
			}
		}
	}
	return nil
}

// median is the median of xs (left as they are).
func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

func modeLabel(m string) string {
	switch m {
	case "off":
		return "off (no provider; baseline)"
	case "on":
		return "on: AlwaysSample, batch, OTLP/HTTP"
	default:
		return "provider, NeverSample"
	}
}

// spanCounts are the spans the provider ended (recorded) and those the
// receiver got in one mode's runs; fewer received means the batch
// processor's queue dropped some.
type spanCounts struct{ ended, received int64 }

func (s *spanCounts) add(o spanCounts) { s.ended += o.ended; s.received += o.received }

func (s spanCounts) String() string { return fmt.Sprintf("%d / %d", s.ended, s.received) }

// tracingRun is one measured run's tracing: the mode's global
// TracerProvider, and what the process spent.
type tracingRun struct {
	tp        *sdktrace.TracerProvider // nil: off
	ended     *endCounter
	recv      *otlpReceiver
	received  int64         // receiver's span count at the start
	cpu0      time.Duration // process CPU at the start
	recvBusy0 time.Duration // receiver's handling time at the start
}

// install sets the global TracerProvider of mode: none for "off", else
// what cmd/outflow/internal/cli's setupTracing builds (batch processor with its
// defaults, OTLP/HTTP exporter) with the sampler fixed, exporting to recv.
func install(ctx context.Context, mode string, recv *otlpReceiver) (*tracingRun, error) {
	r := &tracingRun{recv: recv, received: recv.spans.Load(), ended: &endCounter{}}
	if mode != "off" {
		sampler := sdktrace.AlwaysSample()
		if mode == "never" {
			sampler = sdktrace.NeverSample()
		}
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(recv.URL()))
		if err != nil {
			return nil, fmt.Errorf("OTLP exporter: %w", err)
		}
		r.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(r.ended),
			sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("outflow-bench"))))
		otel.SetTracerProvider(r.tp)
	}
	r.cpu0, r.recvBusy0 = processCPU(), recv.busy()
	return r, nil
}

// flush exports the spans still queued and returns the process CPU spent
// since install, less the receiver's. It belongs to the measured time:
// every span the run made is exported within it, as a process that runs
// on would (the batch processor waits for 512 spans or 5 s, longer than a
// round's pay requests take).
func (r *tracingRun) flush(ctx context.Context) (time.Duration, error) {
	if r.tp != nil {
		if err := r.tp.ForceFlush(ctx); err != nil {
			return 0, fmt.Errorf("flush spans: %w", err)
		}
	}
	return processCPU() - r.cpu0 - (r.recv.busy() - r.recvBusy0), nil
}

// close restores "off" and returns the run's span counts.
func (r *tracingRun) close(ctx context.Context) (spanCounts, error) {
	if r.tp == nil {
		return spanCounts{}, nil
	}
	otel.SetTracerProvider(noop.NewTracerProvider())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.tp.Shutdown(sctx); err != nil {
		return spanCounts{}, fmt.Errorf("shut the tracer provider down: %w", err)
	}
	return spanCounts{ended: r.ended.n.Load(), received: r.recv.spans.Load() - r.received}, nil
}

// endCounter counts the recorded spans that end.
type endCounter struct{ n atomic.Int64 }

func (c *endCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *endCounter) OnEnd(sdktrace.ReadOnlySpan)                     { c.n.Add(1) }
func (c *endCounter) Shutdown(context.Context) error                  { return nil }
func (c *endCounter) ForceFlush(context.Context) error                { return nil }

// payBench serves the reference API on loopback, against a schema of its
// own, with an admin key.
type payBench struct {
	pool       *pgxpool.Pool
	dropSchema func()
	srv        *http.Server
	ln         net.Listener
	started    bool
	served     chan struct{}
	url        string
	secret     string
	merchantID string
	client     *http.Client
	clients    int
}

func newPayBench(ctx context.Context, cfg TracingConfig) (_ *payBench, err error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, int32(cfg.Clients+4))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			drop()
		}
	}()
	writer, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	if err != nil {
		return nil, err
	}
	svc, err := app.NewService(app.Config{Pool: pool, Events: writer})
	if err != nil {
		return nil, err
	}
	m, err := svc.CreateMerchant(ctx, app.NewMerchant{Name: "Bench", WebhookURL: "https://bench.example/h"})
	if err != nil {
		return nil, err
	}
	key, err := apikey.Create(ctx, pool, apikey.New{Name: "bench"})
	if err != nil {
		return nil, err
	}
	api, err := httpapi.New(httpapi.Config{Service: svc, Pool: pool, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	pb := &payBench{pool: pool, dropSchema: drop, srv: &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second},
		served: make(chan struct{}), url: "http://" + ln.Addr().String(), secret: key.Secret, merchantID: m.ID,
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Clients}, Timeout: 30 * time.Second},
		clients: cfg.Clients, ln: ln}
	return pb, nil
}

// Start serves the API until Close.
func (pb *payBench) Start() {
	pb.started = true
	go func() {
		defer close(pb.served)
		_ = pb.srv.Serve(pb.ln)
	}()
}

// Close stops the server, if started, and drops the schema.
func (pb *payBench) Close() {
	_ = pb.srv.Close() // closes the listener too
	if pb.started {
		<-pb.served
	} else {
		_ = pb.ln.Close()
	}
	pb.client.CloseIdleConnections()
	pb.dropSchema()
}

// run pays n fresh pending payments through the API with tracing in mode.
func (pb *payBench) run(ctx context.Context, mode string, recv *otlpReceiver, n int) (sample, spanCounts, time.Duration, error) {
	ids, err := pendingPayments(ctx, pb.pool, pb.merchantID, n)
	if err != nil {
		return sample{}, spanCounts{}, 0, err
	}
	tr, err := install(ctx, mode, recv)
	if err != nil {
		return sample{}, spanCounts{}, 0, err
	}
	s, err := runPayHTTP(ctx, pb, ids)
	t := time.Now()
	cpu, ferr := tr.flush(ctx)
	s.elapsed += time.Since(t)
	spans, cerr := tr.close(ctx)
	return s, spans, cpu, errors.Join(err, ferr, cerr)
}

func runPayHTTP(ctx context.Context, pb *payBench, ids []string) (sample, error) {
	return runClients(ids, pb.clients, func(id string) error { return pb.pay(ctx, id) })
}

func (pb *payBench) pay(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pb.url+"/v1/payments/"+id+"/pay", http.NoBody)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+pb.secret)
	resp, err := pb.client.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pay %s: %d %s", id, resp.StatusCode, body)
	}
	return nil
}

// sampledRows counts the outbox rows whose traceparent is sampled: those
// the API wrote under a recorded server span.
func (pb *payBench) sampledRows(ctx context.Context) (int, error) {
	var n int
	err := pb.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE metadata->>'traceparent' LIKE '%-01'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count traced outbox rows: %w", err)
	}
	return n, nil
}

// tracedDrain is the pipeline benchmark's default drain (see [Pipeline])
// of n events whose rows carry a sampled traceparent, as rows written
// under a traced request do: the forwarder links its send spans to them
// and each consumer span is their child. It returns the time from the
// start of forwarder and worker to the last event handled and its spans
// exported, and the process CPU spent meanwhile.
type drainResult struct {
	elapsed, cpu time.Duration
	spans        spanCounts
}

func tracedDrain(ctx context.Context, cfg TracingConfig, mode string, recv *otlpReceiver, n int) (drainResult, error) {
	pool, dropSchema, err := Schema(ctx, cfg.DatabaseURL, 16)
	if err != nil {
		return drainResult{}, err
	}
	defer dropSchema()
	topic := "bench." + uuid.NewString()[:8]
	rdb, err := redisstreams.NewClient(ctx, cfg.RedisURL)
	if err != nil {
		return drainResult{}, err
	}
	defer rdb.Close()
	defer rdb.Del(context.WithoutCancel(ctx), topic)
	if err := seedPayments(ctx, pool, topic, n); err != nil {
		return drainResult{}, err
	}
	// A traceparent per row (its own trace, sampled), derived from the row.
	if _, err := pool.Exec(ctx, `
		UPDATE outbox SET metadata = metadata || jsonb_build_object('traceparent',
			'00-' || md5(message_id::text) || '-' || substr(md5(aggregate_id || aggregate_version), 1, 16) || '-01')`); err != nil {
		return drainResult{}, fmt.Errorf("add traceparents: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		return drainResult{}, err
	}
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	if err != nil {
		return drainResult{}, err
	}
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Logger: quietLogger(), MessagingSystem: "redis"})
	if err != nil {
		return drainResult{}, err
	}
	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		return drainResult{}, err
	}
	backend, err := redisBackend(ctx, cfg.RedisURL)
	if err != nil {
		return drainResult{}, err
	}
	defer backend.Close()
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg, Logger: quietLogger()})
	if err != nil {
		return drainResult{}, err
	}
	h := handlers.SyncAnalytics()
	h.Topic = topic
	if err := w.Add(h); err != nil {
		return drainResult{}, err
	}

	tr, err := install(ctx, mode, recv)
	if err != nil {
		return drainResult{}, err
	}
	var res drainResult
	err = func() error {
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		start := time.Now()
		wg.Go(func() { _ = f.Run(rctx) })
		wg.Go(func() { _ = w.Run(rctx) })
		if err := waitHandled(ctx, n, 10*time.Minute, func(ctx context.Context) (int, error) { return countHandled(ctx, pool) }); err != nil {
			return err
		}
		res.cpu, err = tr.flush(ctx)
		res.elapsed = time.Since(start)
		return err
	}()
	spans, cerr := tr.close(ctx) // forwarder and worker stopped: every span ended
	if err := errors.Join(err, cerr); err != nil {
		return drainResult{}, err
	}
	res.spans = spans
	if err := checkProjection(ctx, pool, n); err != nil {
		return drainResult{}, err
	}
	return res, nil
}
