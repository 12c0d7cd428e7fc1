package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outflow-dev/outflow/consumer"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/app/paymentevents"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/poll"
)

// PipelineConfig configures [Pipeline].
type PipelineConfig struct {
	DatabaseURL string
	RedisURL    string
	// Backlog is how many events each drain variant moves.
	Backlog int
	// Rate and Duration shape the steady run: events per second offered,
	// one per transaction, for Duration.
	Rate     int
	Duration time.Duration
	// Producers is how many goroutines commit the steady run's events.
	Producers int
	// ConsumerBatch is the steady worker's read and shared-transaction
	// size. Defaults to the worker's default (100).
	ConsumerBatch int
	// PerTx is how many events (of distinct payments) one producer
	// transaction commits. Defaults to 1.
	PerTx int
	// Only lists the parts to run: drain, steady. Empty runs both.
	Only []string
	Out  io.Writer
}

// Pipeline measures the whole pipeline without the HTTP API: payment events
// in the outbox, the forwarder, Redis Streams, and SyncAnalytics behind the
// idempotency middleware, everything on this machine at once.
//
// Drain: the same backlog of payment events (created, paid, a fifth
// refunded; versions in order per payment) is moved end to end by three
// consumers, back to back: SyncAnalytics's effect as a plain Watermill
// handler with a transaction per message (no deduplication, no order: the
// baseline), behind the middleware with a transaction per message, and
// behind the middleware with shared transactions (the default).
//
// Steady: producers commit events at Rate for Duration while the forwarder
// and the default worker run; it reports the rate consumed, the lag left
// when the producers stop, and commit-to-handled latency.
func Pipeline(ctx context.Context, cfg PipelineConfig) error {
	out := cfg.Out
	fmt.Fprintf(out, "pipeline: outbox -> forwarder -> Redis Streams -> SyncAnalytics, %d events per drain\n\n", cfg.Backlog)
	variants := []struct {
		name         string
		plain        bool
		read, shared int
	}{
		{"plain handler, one message at a time, 1 tx each (baseline)", true, 1, 1},
		{"middleware, one message at a time, 1 tx each", false, 1, 1},
		{"plain handler, 100 in flight, 1 tx each", true, 100, 1},
		{"middleware, 100 in flight, shared transactions (default)", false, 100, 100},
	}
	runs := func(part string) bool { return len(cfg.Only) == 0 || slices.Contains(cfg.Only, part) }
	if !runs("drain") {
		variants = nil
	}
	rates := make([]float64, len(variants))
	for i, v := range variants {
		r, err := drain(ctx, cfg, v.plain, v.read, v.shared)
		if err != nil {
			return fmt.Errorf("drain (%s): %w", v.name, err)
		}
		rates[i] = r
	}
	if len(variants) > 0 {
		fmt.Fprintf(out, "| consumer | events/s end to end | vs baseline |\n| --- | ---: | ---: |\n")
		for i, v := range variants {
			fmt.Fprintf(out, "| %s | %.0f | %.2fx |\n", v.name, rates[i], rates[i]/rates[0])
		}
		fmt.Fprintln(out)
	}
	if !runs("steady") {
		return nil
	}

	s, err := steady(ctx, cfg)
	if err != nil {
		return fmt.Errorf("steady run: %w", err)
	}
	fmt.Fprintf(out, "steady: offered %d events/s for %s (%d producers, %d events per transaction): committed %.0f/s, handled %.0f/s (%.2fx) while producing;\n"+
		"  lag when the producers stopped: %d events (%d of them not yet published), all handled %.2fs later (%.0f events/s); commit-to-handled latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n"+
		"  outcomes: %s; projection checked: every paid event counted once\n\n",
		cfg.Rate, cfg.Duration, cfg.Producers, max(cfg.PerTx, 1), s.committedRate, s.handledWhileProducing, s.handledWhileProducing/s.committedRate,
		s.lagAtStop, s.unpublishedAtStop, s.catchUp.Seconds(), catchUpRate(s), s.p50, s.p99, s.max, s.outcomes)
	return nil
}

// seedPayments writes n payment events: payments of three or two events
// (created, paid, and refunded for one in five), in version order, for 50
// merchants.
func seedPayments(ctx context.Context, pool *pgxpool.Pool, topic string, n int) error {
	_, err := pool.Exec(ctx, `
		WITH p AS (
			SELECT g, gen_random_uuid()::text AS id, 'merchant-' || (g % 50) AS merchant, 1000 + (g % 9000) AS amount
			FROM generate_series(1, $2::int) g
		), e AS (
			SELECT p.*, v FROM p CROSS JOIN LATERAL generate_series(1, CASE WHEN p.g % 5 = 0 THEN 3 ELSE 2 END) v
		)
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), $1, 'payment', id, v,
		       (ARRAY['payment.created', 'payment.paid', 'payment.refunded'])[v],
		       jsonb_build_object('payment_id', id, 'merchant_id', merchant, 'amount', amount, 'currency', 'EUR',
		                          'status', 'x', 'created_at', now(), 'paid_at', now(), 'refunded_at', now(),
		                          'refunded_amount', amount, 'payment_amount', amount),
		       now()
		FROM (SELECT * FROM e ORDER BY g, v LIMIT $3) e`, topic, n/2+1, n)
	if err != nil {
		return fmt.Errorf("seed outbox: %w", err)
	}
	_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	return err
}

// drain moves a seeded backlog through forwarder and consumer and returns
// events per second, from the start of both to the last event handled.
func drain(ctx context.Context, cfg PipelineConfig, plain bool, read, shared int) (float64, error) {
	pool, dropSchema, err := Schema(ctx, cfg.DatabaseURL, 16)
	if err != nil {
		return 0, err
	}
	defer dropSchema()
	topic := "bench." + uuid.NewString()[:8]
	rdb, err := redisstreams.NewClient(ctx, cfg.RedisURL)
	if err != nil {
		return 0, err
	}
	defer rdb.Close()
	backend, err := redisBackend(ctx, cfg.RedisURL)
	if err != nil {
		return 0, err
	}
	defer backend.Close() // after the worker stopped (deferred below)
	defer rdb.Del(context.WithoutCancel(ctx), topic)
	if err := seedPayments(ctx, pool, topic, cfg.Backlog); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	if err != nil {
		return 0, err
	}
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Logger: quietLogger()})
	if err != nil {
		return 0, err
	}
	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		return 0, err
	}
	var handled func(context.Context) (int, error)
	start := time.Now()
	wg.Go(func() { _ = f.Run(rctx) })
	if plain {
		var n atomic.Int64
		run, err := plainConsumer(rctx, cfg.RedisURL, pool, reg, topic, read, &n)
		if err != nil {
			return 0, err
		}
		wg.Go(func() { _ = run() })
		handled = func(context.Context) (int, error) { return int(n.Load()), nil }
	} else {
		w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg,
			BatchSize: read, Idempotency: idempotency.Config{MaxBatch: shared}, Logger: quietLogger()})
		if err != nil {
			return 0, err
		}
		h := handlers.SyncAnalytics()
		h.Topic = topic
		if err := w.Add(h); err != nil {
			return 0, err
		}
		wg.Go(func() { _ = w.Run(rctx) })
		handled = func(ctx context.Context) (int, error) { return countHandled(ctx, pool) }
	}
	if err := waitHandled(ctx, cfg.Backlog, 10*time.Minute, handled); err != nil {
		return 0, err
	}
	rate := float64(cfg.Backlog) / time.Since(start).Seconds()
	if err := checkProjection(ctx, pool, cfg.Backlog); err != nil {
		return 0, err
	}
	var held int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&held); err != nil {
		return 0, err
	}
	if held > 0 {
		fmt.Fprintf(cfg.Out, "  (%d events arrived before their predecessor and were held, then applied)\n", held)
	}
	return rate, nil
}

// waitHandled waits until handled counts n events or more.
func waitHandled(ctx context.Context, n int, limit time.Duration, handled func(context.Context) (int, error)) error {
	var got int
	err := poll.Until(ctx, 20*time.Millisecond, limit, func() (bool, error) {
		var err error
		got, err = handled(ctx)
		return got >= n, err
	})
	if errors.Is(err, poll.ErrTimeout) {
		return fmt.Errorf("only %d of %d events handled in %s", got, n, limit)
	}
	return err
}

// countHandled counts the messages the consumer is done with, from its
// only bookkeeping, the aggregates' versions: the bench's payments start at
// version 1 and a Strict consumer applies them one by one, so an aggregate
// at version v has had v events handled, and the sum of the versions is
// the count (one row per payment to read, not one per event). A message
// held for its predecessor is not counted until it applied.
func countHandled(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(version), 0) FROM consumer_aggregate_versions`).Scan(&n)
	return n, err
}

// checkProjection fails the run unless the projection counted every paid
// event exactly once: a benchmark of a consumer that loses or doubles
// effects would measure nothing.
func checkProjection(ctx context.Context, pool *pgxpool.Pool, n int) error {
	var want, got int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'payment.paid'`).Scan(&want); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(paid_count), 0) FROM merchant_stats_daily`).Scan(&got); err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("projection counted %d paid events, the outbox holds %d", got, want)
	}
	return nil
}

// plainConsumer is the baseline: SyncAnalytics's effect as a plain
// Watermill handler (one autocommitted upsert per paid or refunded event;
// nothing for the others), on the same subscriber, with neither
// deduplication nor version order.
func plainConsumer(ctx context.Context, redisURL string, pool *pgxpool.Pool, reg *events.Registry, topic string, read int, n *atomic.Int64) (func() error, error) {
	client, err := redisstreams.NewClient(ctx, redisURL)
	if err != nil {
		return nil, err
	}
	sub, err := redisstreams.NewSubscriber(redisstreams.SubscriberConfig{Client: client, ConsumerGroup: "plain", Consumer: "bench", BatchSize: read})
	if err != nil {
		client.Close()
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		client.Close()
		return nil, err
	}
	router.AddConsumerHandler("plain", topic, sub, func(msg *message.Message) error {
		defer n.Add(1)
		t := msg.Metadata.Get(events.EventTypeKey)
		if t != paymentevents.PaidType && t != paymentevents.RefundedType {
			return nil
		}
		ev, err := reg.DecodeMessage(msg)
		if err != nil {
			return err
		}
		sql, args, err := handlers.SyncAnalyticsStatement(ev)
		if err != nil {
			return err
		}
		_, err = pool.Exec(msg.Context(), sql, args...) // on its own, autocommitted
		return err
	})
	return func() error {
		defer client.Close()
		return router.Run(ctx)
	}, nil
}

type steadyResult struct {
	committedRate, handledRate float64
	// handledWhileProducing is the events handled per second while the
	// producers ran: what has to keep up with committedRate.
	handledWhileProducing float64
	lagAtStop             int
	// unpublishedAtStop is the part of the lag still in the outbox, not yet
	// on the broker: the forwarder's share, not the consumer's.
	unpublishedAtStop int
	catchUp           time.Duration
	p50, p99, max     float64
	outcomes          string
}

// catchUpRate is how fast the lag left at the producers' stop was handled.
func catchUpRate(s steadyResult) float64 {
	if s.catchUp <= 0 {
		return 0
	}
	return float64(s.lagAtStop) / s.catchUp.Seconds()
}

// ackTimes records when the worker acknowledged each message: the
// outermost middleware returning nil, after the commit. A message held for
// its predecessor is acknowledged when parked; its handling time is its
// dead letter's resolved_at instead. It also records when each message
// first reached the middleware, which splits a latency into the way to
// the worker (forwarder, broker, subscriber) and the worker's own part
// (batching, claims, handler, commit); see stageClock.
type ackTimes struct {
	mu       sync.Mutex
	at       map[string]time.Time
	received map[string]time.Time
}

func (a *ackTimes) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		got := time.Now()
		a.mu.Lock()
		if a.received == nil {
			a.received = map[string]time.Time{}
		}
		if _, ok := a.received[msg.UUID]; !ok {
			a.received[msg.UUID] = got
		}
		a.mu.Unlock()
		out, err := h(msg)
		if err == nil {
			now := time.Now()
			a.mu.Lock()
			if _, ok := a.at[msg.UUID]; !ok { // the first acknowledgement, not a duplicate's
				a.at[msg.UUID] = now
			}
			a.mu.Unlock()
		}
		return out, err
	}
}

// latencies returns the p50, p99 and max of commit-to-handled in
// milliseconds, of the outbox rows of w: from the row's created_at (the producer's
// transaction start, on the database's clock, which is this machine's)
// to the worker's acknowledgement, or to its dead letter's resolution for
// a message that was held.
func (a *ackTimes) latencies(ctx context.Context, pool *pgxpool.Pool, w window) (p50, p99, maxMs float64, err error) {
	resolved := map[string]time.Time{}
	rows, err := pool.Query(ctx, `SELECT message_id::text, resolved_at FROM dead_letters WHERE status = 'resolved'`)
	if err != nil {
		return 0, 0, 0, err
	}
	var (
		id string
		at time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { resolved[id] = at; return nil }); err != nil {
		return 0, 0, 0, err
	}
	rows, err = pool.Query(ctx, `SELECT message_id::text, created_at FROM outbox WHERE id > $1`+w.createdFilter("created_at"), w.args()...)
	if err != nil {
		return 0, 0, 0, err
	}
	var d []float64
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		done, ok := resolved[id]
		if !ok {
			done, ok = a.at[id]
		}
		if ok {
			d = append(d, float64(done.Sub(at))/float64(time.Millisecond))
		}
		return nil
	}); err != nil {
		return 0, 0, 0, err
	}
	if len(d) == 0 {
		return 0, 0, 0, nil
	}
	slices.Sort(d)
	return quantile(d, 0.5), quantile(d, 0.99), d[len(d)-1], nil
}

// window picks the outbox rows a latency is taken of: after afterID,
// and, when they are set, created from From (inclusive) to To (exclusive).
type window struct {
	afterID  int64
	from, to time.Time
}

// createdFilter is w's conditions on column (the outbox's created_at),
// as $2 and $3 after afterID's $1; both always bound (a zero time
// matches every row).
func (w window) createdFilter(column string) string {
	return ` AND ($2::timestamptz IS NULL OR ` + column + ` >= $2) AND ($3::timestamptz IS NULL OR ` + column + ` < $3)`
}

func (w window) args() []any {
	arg := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t
	}
	return []any{w.afterID, arg(w.from), arg(w.to)}
}

// sentRow is an outbox row of a latency window: its message and when its
// transaction started (created_at, where a latency starts).
type sentRow struct {
	id string
	at time.Time
}

// neverHeld reads the outbox rows of w that no consumer held as a gap:
// a held one is done when its dead letter resolves, and ackTimes has only
// when it was parked.
func neverHeld(ctx context.Context, pool *pgxpool.Pool, w window) ([]sentRow, error) {
	rows, err := pool.Query(ctx, `SELECT o.message_id::text, o.created_at FROM outbox o
		WHERE o.id > $1 AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.message_id = o.message_id AND d.reason = 'gap')`+
		w.createdFilter("o.created_at"), w.args()...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (sentRow, error) {
		var s sentRow
		return s, r.Scan(&s.id, &s.at)
	})
}

// p99NeverHeld is the commit-to-handled p99, in milliseconds, of rows
// (neverHeld's).
func (a *ackTimes) p99NeverHeld(rows []sentRow) float64 {
	var d []float64
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range rows {
		if done, ok := a.at[r.id]; ok {
			d = append(d, float64(done.Sub(r.at))/float64(time.Millisecond))
		}
	}
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return quantile(d, 0.99)
}

// outcomes reads the consumer's counters: what it decided for each message.
func outcomes(reg *prometheus.Registry) (string, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return "", err
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				got[mf.GetName()] += c.GetValue()
			}
		}
	}
	return fmt.Sprintf("handled %.0f, held %.0f, duplicates %.0f, stale %.0f, retried %.0f, dead %.0f",
		got[idempotency.MetricHandled], got[idempotency.MetricHeld], got[idempotency.MetricDuplicates],
		got[idempotency.MetricStale], got[idempotency.MetricRetried], got[idempotency.MetricDead]), nil
}

// steady offers Rate events per second, one per transaction, through the
// outbox writer while the forwarder and the default worker run.
func steady(ctx context.Context, cfg PipelineConfig) (steadyResult, error) {
	pool, dropSchema, err := Schema(ctx, cfg.DatabaseURL, int32(cfg.Producers+12))
	if err != nil {
		return steadyResult{}, err
	}
	defer dropSchema()
	topic := "bench." + uuid.NewString()[:8]
	rdb, err := redisstreams.NewClient(ctx, cfg.RedisURL)
	if err != nil {
		return steadyResult{}, err
	}
	defer rdb.Close()
	backend, err := redisBackend(ctx, cfg.RedisURL)
	if err != nil {
		return steadyResult{}, err
	}
	defer backend.Close() // after the worker stopped (deferred below)
	defer rdb.Del(context.WithoutCancel(ctx), topic)

	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb})
	if err != nil {
		return steadyResult{}, err
	}
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Logger: quietLogger()})
	if err != nil {
		return steadyResult{}, err
	}
	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		return steadyResult{}, err
	}
	metrics := prometheus.NewRegistry()
	acks := &ackTimes{at: map[string]time.Time{}}
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg, Logger: quietLogger(),
		BatchSize: cfg.ConsumerBatch, Idempotency: idempotency.Config{MaxBatch: cfg.ConsumerBatch, Metrics: metrics},
		Middleware: []message.HandlerMiddleware{acks.middleware}})
	if err != nil {
		return steadyResult{}, err
	}
	h := handlers.SyncAnalytics()
	h.Topic = topic
	if err := w.Add(h); err != nil {
		return steadyResult{}, err
	}
	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	if err != nil {
		return steadyResult{}, err
	}
	wg.Go(func() { _ = f.Run(rctx) })
	wg.Go(func() { _ = w.Run(rctx) })
	time.Sleep(time.Second) // leases taken, consumer group created

	perTx := max(cfg.PerTx, 1)
	total := int(cfg.Duration.Seconds()*float64(cfg.Rate)) / perTx * perTx
	jobs := make(chan int, cfg.Rate)
	var (
		pwg     sync.WaitGroup
		prodErr atomic.Value
		ok      atomic.Int64
	)
	for range cfg.Producers {
		pwg.Go(func() {
			for first := range jobs {
				evs := make([]events.Event, 0, perTx)
				for i := first; i < first+perTx; i++ {
					// Event i: a group of perTx payments at one version;
					// the next group is the same payments' next version.
					// Created, paid, and refunded for every payment.
					pay := (i/(3*perTx))*perTx + i%perTx
					v := int64((i/perTx)%3 + 1)
					ev, err := events.New(ctx, events.Aggregate{Type: paymentevents.AggregateType, ID: fmt.Sprintf("pay-%d", pay), Version: v},
						benchPayment(pay, v))
					if err != nil {
						prodErr.Store(err)
						continue
					}
					evs = append(evs, ev)
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writer.PublishTx(ctx, tx, evs...) })
				if err != nil {
					prodErr.Store(err)
					continue
				}
				ok.Add(int64(len(evs)))
			}
		})
	}
	// Groups go to the channel in order and are taken by whichever producer
	// is free, so a payment's events may commit out of order: the
	// consumer's version order is part of what runs.
	start := time.Now()
	tick := time.NewTicker(time.Second * time.Duration(perTx) / time.Duration(cfg.Rate))
	for i := 0; i < total; i += perTx {
		<-tick.C
		jobs <- i
	}
	tick.Stop()
	close(jobs)
	pwg.Wait()
	produced := time.Since(start)
	if e, ok := prodErr.Load().(error); ok {
		return steadyResult{}, fmt.Errorf("produce: %w", e)
	}
	count := func() int {
		n, _ := countHandled(ctx, pool)
		return n
	}
	n := int(ok.Load())
	atStop := count()
	var unpublished int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&unpublished); err != nil {
		return steadyResult{}, err
	}
	res := steadyResult{committedRate: float64(n) / produced.Seconds(), lagAtStop: n - atStop, unpublishedAtStop: unpublished,
		handledWhileProducing: float64(atStop) / produced.Seconds()}
	stopped := time.Now()
	// A consumer that handled nothing for a minute will not catch up (a
	// backlog drains at thousands a second).
	last, progressed := atStop, stopped
	for c := count(); c < n; c = count() {
		if c > last {
			last, progressed = c, time.Now()
		}
		if time.Since(progressed) > time.Minute {
			var (
				parked      string
				unpublished int
			)
			_ = pool.QueryRow(ctx, `SELECT coalesce(string_agg(status || ' ' || reason || ': ' || n, ', '), 'none')
				FROM (SELECT status, reason, count(*) n FROM dead_letters GROUP BY 1, 2) d`).Scan(&parked)
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&unpublished)
			return steadyResult{}, fmt.Errorf("the consumer did not catch up: %d of %d events handled, %d not published; dead letters: %s; not handled: %s",
				count(), n, unpublished, parked, notHandled(ctx, pool, rdb, topic))
		}
		time.Sleep(10 * time.Millisecond)
	}
	res.catchUp = time.Since(stopped)
	res.handledRate = float64(n) / time.Since(start).Seconds()
	if err := checkProjection(ctx, pool, n); err != nil {
		return res, err
	}
	if res.outcomes, err = outcomes(metrics); err != nil {
		return res, err
	}
	res.p50, res.p99, res.max, err = acks.latencies(ctx, pool, window{})
	return res, err
}

// notHandled describes the first events the consumer has not applied: the
// outbox's state of each, whether the stream holds it, and the version
// the consumer stands at, so that a run that does not catch up says where
// the event stopped.
func notHandled(ctx context.Context, pool *pgxpool.Pool, rdb goredis.UniversalClient, topic string) string {
	rows, err := pool.Query(ctx, `
		SELECT o.id, o.message_id::text, o.aggregate_id, o.aggregate_version, coalesce(v.version, 0), s.state, o.transaction_id::text
		FROM outbox o JOIN outbox_state s ON s.id = o.id
		LEFT JOIN consumer_aggregate_versions v ON v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id
		WHERE o.aggregate_version > coalesce(v.version, 0) ORDER BY o.id LIMIT 5`)
	if err != nil {
		return err.Error()
	}
	type missing struct {
		id                  int64
		mid, agg, state, tx string
		ver, at             int64
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (missing, error) {
		var m missing
		return m, r.Scan(&m.id, &m.mid, &m.agg, &m.ver, &m.at, &m.state, &m.tx)
	})
	if err != nil {
		return err.Error()
	}
	inStream := map[string]bool{}
	entries, err := rdb.XRange(ctx, topic, "-", "+").Result()
	if err != nil {
		return err.Error()
	}
	um := redisstream.DefaultMarshallerUnmarshaller{}
	for _, e := range entries {
		msg, err := um.Unmarshal(e.Values)
		if err != nil {
			return err.Error()
		}
		if env, err := events.EnvelopeFromMessage(msg); err == nil {
			inStream[env.MessageID] = true
		}
	}
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("id %d %s v%d (consumer at v%d, outbox %s, tx %s, in the stream: %t)",
			m.id, m.agg, m.ver, m.at, m.state, m.tx, inStream[m.mid]))
	}
	return strings.Join(out, "; ")
}

func benchPayment(pay int, v int64) events.Payload {
	now := time.Now()
	id, merchant := fmt.Sprintf("pay-%d", pay), fmt.Sprintf("merchant-%d", pay%50)
	switch v {
	case 1:
		return paymentevents.Created{PaymentID: id, MerchantID: merchant, Amount: 1000, Currency: "EUR", Status: "pending", CreatedAt: now}
	case 2:
		return paymentevents.Paid{PaymentID: id, MerchantID: merchant, Amount: 1000, Currency: "EUR", PaidAt: now}
	default:
		return paymentevents.Refunded{PaymentID: id, MerchantID: merchant, Amount: 1000, RefundedAmount: 1000, PaymentAmount: 1000,
			Currency: "EUR", Status: "refunded", RefundedAt: now}
	}
}
