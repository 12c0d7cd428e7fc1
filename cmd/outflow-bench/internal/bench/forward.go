package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wmforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/poll"
)

// ForwardConfig configures the forwarder benchmarks.
type ForwardConfig struct {
	// DatabaseURL is where fresh schemas are made. Required.
	DatabaseURL string
	// Redis is the broker. Required.
	Redis *redis.Client
	// Backlog is the row count each throughput contender drains. Defaults
	// to 100,000.
	Backlog int
	// Rate and Duration shape the latency run. Default 1000/s for 10s.
	Rate     int
	Duration time.Duration
	// Published is how many published rows the claim-cost run keeps.
	// Defaults to 1,000,000.
	Published int
	// Only runs just these parts: "throughput", "latency", "claim". Empty
	// runs all.
	Only []string
	Out  io.Writer
}

// payload is about the size of a payment event.
const benchPayload = `{"payment_id":"01a236bd-223f-7522-9b4d-bf20c60c532d","merchant_id":"01a236bd-1ee8-76bc-97f9-db64d791fd62","amount":6711,"currency":"GBP","status":"refunded","refunded_at":"2026-12-02T12:31:34.482209Z","payment_amount":13422,"refunded_amount":13422}`

// Forward runs the forwarder benchmarks, each with its baseline in the same
// run: throughput against Watermill's stock forwarder and against a raw
// claim/XADD/mark loop, commit-to-stream latency at a steady rate, and the
// claim's cost with a million published rows kept.
func Forward(ctx context.Context, cfg ForwardConfig) error {
	if cfg.Backlog <= 0 {
		cfg.Backlog = 100_000
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 1000
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.Published <= 0 {
		cfg.Published = 1_000_000
	}
	out := cfg.Out
	fmt.Fprintf(out, "forwarder benchmarks: %d-row backlog, latency at %d events/s for %s, claim cost with %d published rows\n\n",
		cfg.Backlog, cfg.Rate, cfg.Duration, cfg.Published)

	want := func(part string) bool { return len(cfg.Only) == 0 || slices.Contains(cfg.Only, part) }
	if want("throughput") {
		if err := throughput(ctx, cfg); err != nil {
			return err
		}
	}
	if want("latency") {
		lat, err := runLatency(ctx, cfg)
		if err != nil {
			return fmt.Errorf("latency: %w", err)
		}
		fmt.Fprintf(out, "commit-to-stream latency at %d events/s (%d events, one per transaction): p50 %.1f ms  p99 %.1f ms  max %.1f ms\n\n",
			cfg.Rate, lat.n, ms(lat.p50), ms(lat.p99), ms(lat.max))
	}
	if want("claim") {
		empty, err := runOurs(ctx, cfg, 20_000, 0)
		if err != nil {
			return err
		}
		full, err := runOurs(ctx, cfg, 20_000, cfg.Published)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "claim cost, mean batch (claim+publish+mark+commit of 500 rows) draining 20,000 rows:\n")
		fmt.Fprintf(out, "  empty table %.2f ms   with %d published rows %.2f ms   ratio %.2fx\n",
			empty.batchMs, cfg.Published, full.batchMs, full.batchMs/empty.batchMs)
	}
	return nil
}

func throughput(ctx context.Context, cfg ForwardConfig) error {
	out := cfg.Out
	stock, err := runStock(ctx, cfg)
	if err != nil {
		return fmt.Errorf("stock forwarder: %w", err)
	}
	raw, err := runRaw(ctx, cfg)
	if err != nil {
		return fmt.Errorf("raw loop: %w", err)
	}
	ours, err := runOurs(ctx, cfg, cfg.Backlog, 0)
	if err != nil {
		return fmt.Errorf("outflow forwarder: %w", err)
	}
	fmt.Fprintf(out, "throughput, draining %d rows to Redis Streams (1 instance each):\n", cfg.Backlog)
	fmt.Fprintf(out, "  watermill components/forwarder (sql v4 subscriber -> redisstream) %8.0f rows/s\n", stock)
	fmt.Fprintf(out, "  raw loop (claim 500 SKIP LOCKED, pipelined XADD, one UPDATE)      %8.0f rows/s\n", raw)
	fmt.Fprintf(out, "  outflow forwarder                                                 %8.0f rows/s  (peak heap %.1f MiB)\n", ours.rate, ours.heapMiB)
	fmt.Fprintf(out, "  outflow / stock = %.1fx   outflow / raw = %.2f\n\n", ours.rate/stock, ours.rate/raw)

	small, err := runOurs(ctx, cfg, cfg.Backlog/10, 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "memory: peak heap %.1f MiB draining %d rows, %.1f MiB draining %d\n\n", small.heapMiB, cfg.Backlog/10, ours.heapMiB, cfg.Backlog)

	return nil
}

// seedOutbox inserts n pending rows for 1000 aggregates and, if published >
// 0, that many already-published rows before them: the partitions' cursors
// past them (publishThroughSQL), as a forwarder leaves them.
func seedOutbox(ctx context.Context, pool *pgxpool.Pool, topic string, n, published int) error {
	if published > 0 {
		for done := 0; done < published; done += 200_000 {
			k := min(200_000, published-done)
			if _, err := pool.Exec(ctx, `
				INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
				SELECT gen_random_uuid(), $1, 'payment', 'old-' || (g % 1000), $3 + g, 'payment.paid', $2::jsonb, now()
				FROM generate_series(1, $4) g`, topic, benchPayload, done, k); err != nil {
				return err
			}
		}
		if _, err := pool.Exec(ctx, publishThroughSQL); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), $1, 'payment', 'agg-' || (g % 1000), g / 1000 + 1, 'payment.paid', $2::jsonb, now()
		FROM generate_series(0, $3 - 1) g ORDER BY g`, topic, benchPayload, n)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	return err
}

type oursResult struct {
	rate, heapMiB, batchMs float64
}

func runOurs(ctx context.Context, cfg ForwardConfig, backlog, published int) (oursResult, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 8)
	if err != nil {
		return oursResult{}, err
	}
	defer drop()
	topic := "bench." + uuid.NewString()[:8]
	defer cfg.Redis.Del(context.WithoutCancel(ctx), topic)
	if err := seedOutbox(ctx, pool, topic, backlog, published); err != nil {
		return oursResult{}, err
	}
	broker, err := redisstreams.New(redisstreams.Config{Client: cfg.Redis})
	if err != nil {
		return oursResult{}, err
	}
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Registerer: reg, Logger: quietLogger()})
	if err != nil {
		return oursResult{}, err
	}
	runtime.GC()
	var peak atomic.Uint64
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	err = waitStream(ctx, cfg.Redis, topic, int64(backlog), &peak)
	elapsed := time.Since(start)
	cancel()
	if rerr := <-done; err == nil {
		err = rerr
	}
	if err != nil {
		return oursResult{}, err
	}
	return oursResult{
		rate:    float64(backlog) / elapsed.Seconds(),
		heapMiB: float64(peak.Load()) / (1 << 20),
		batchMs: histogramMeanMs(reg, "outflow_forwarder_batch_seconds"),
	}, nil
}

// waitStream waits until stream holds n entries, sampling the heap.
func waitStream(ctx context.Context, rdb *redis.Client, stream string, n int64, peak *atomic.Uint64) error {
	var (
		ms  runtime.MemStats
		got int64
	)
	err := poll.Until(ctx, 10*time.Millisecond, 10*time.Minute, func() (bool, error) {
		var err error
		got, err = rdb.XLen(ctx, stream).Result()
		if peak != nil {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
		return got >= n, err
	})
	if errors.Is(err, poll.ErrTimeout) {
		return fmt.Errorf("stream %s holds %d of %d entries: %w", stream, got, n, err)
	}
	return err
}

func histogramMeanMs(g prometheus.Gatherer, name string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var h *dto.Histogram = mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() == 0 {
				return 0
			}
			return 1000 * h.GetSampleSum() / float64(h.GetSampleCount())
		}
	}
	return 0
}

// runRaw is the ceiling: the relay without a framework, a tight
// claim-publish-mark loop with nothing else around it.
func runRaw(ctx context.Context, cfg ForwardConfig) (float64, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 4)
	if err != nil {
		return 0, err
	}
	defer drop()
	topic := "bench." + uuid.NewString()[:8]
	defer cfg.Redis.Del(context.WithoutCancel(ctx), topic)
	if err := seedOutbox(ctx, pool, topic, cfg.Backlog, 0); err != nil {
		return 0, err
	}
	// The raw relay marks published_at itself, which the forwarder no
	// longer does (00025 dropped its index): its own index of what waits,
	// as the outbox had before.
	if _, err := pool.Exec(ctx, `CREATE INDEX raw_pending_idx ON outbox (id) WHERE published_at IS NULL`); err != nil {
		return 0, err
	}
	start := time.Now()
	total := 0
	for total < cfg.Backlog {
		n, err := rawBatch(ctx, pool, cfg.Redis, topic)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		total += n
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

func rawBatch(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, topic string) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, `
		SELECT id, message_id::text, payload::text, event_type, aggregate_type, aggregate_id, aggregate_version, occurred_at
		FROM outbox WHERE published_at IS NULL
		ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED`)
	if err != nil {
		return 0, err
	}
	type r struct {
		ID            int64
		MID           string
		Payload       string
		EventType     string
		AggregateType string
		AggregateID   string
		Version       int64
		OccurredAt    time.Time
	}
	batch, err := pgx.CollectRows(rows, pgx.RowToStructByPos[r])
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	pipe := rdb.Pipeline()
	ids := make([]int64, len(batch))
	for i, x := range batch {
		ids[i] = x.ID
		// The same entry as the forwarder writes: watermill-redisstream's
		// format with the envelope as metadata.
		msg := message.NewMessage(x.MID, []byte(x.Payload))
		msg.Metadata = events.Envelope{MessageID: x.MID, EventType: x.EventType, AggregateType: x.AggregateType,
			AggregateID: x.AggregateID, AggregateVersion: x.Version, OccurredAt: x.OccurredAt}.Metadata()
		values, err := redisstream.DefaultMarshallerUnmarshaller{}.Marshal(topic, msg)
		if err != nil {
			return 0, err
		}
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = ANY($1)`, ids); err != nil {
		return 0, err
	}
	return len(batch), tx.Commit(ctx)
}

// runStock is the stock Watermill way: components/forwarder over the
// watermill-sql v4 subscriber (default PostgreSQL schema) publishing to
// watermill-redisstream.
func runStock(ctx context.Context, cfg ForwardConfig) (float64, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 4)
	if err != nil {
		return 0, err
	}
	defer drop()
	logger := watermill.NopLogger{}
	fwdTopic := "stock_forwarder_" + uuid.NewString()[:8]
	dest := "bench." + uuid.NewString()[:8]
	defer cfg.Redis.Del(context.WithoutCancel(ctx), dest)
	schema := wmsql.DefaultPostgreSQLSchema{}
	beginner := wmsql.BeginnerFromPgx(pool)
	sub, err := wmsql.NewSubscriber(beginner, wmsql.SubscriberConfig{
		ConsumerGroup: "forwarder", SchemaAdapter: schema, OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return 0, err
	}
	if err := sub.SubscribeInitialize(fwdTopic); err != nil {
		return 0, err
	}
	// The backlog, written as a producer would: enveloped by the stock
	// forwarder publisher, in transactions of 1000.
	for done := 0; done < cfg.Backlog; done += 1000 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sqlPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: schema}, logger)
			if err != nil {
				return err
			}
			pub := wmforwarder.NewPublisher(sqlPub, wmforwarder.PublisherConfig{ForwarderTopic: fwdTopic})
			msgs := make([]*message.Message, 0, 1000)
			for i := range min(1000, cfg.Backlog-done) {
				m := message.NewMessage(uuid.NewString(), []byte(benchPayload))
				m.Metadata.Set(events.AggregateIDKey, fmt.Sprintf("agg-%d", (done+i)%1000))
				m.SetContext(ctx)
				msgs = append(msgs, m)
			}
			return pub.Publish(dest, msgs...)
		})
		if err != nil {
			return 0, err
		}
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: cfg.Redis}, logger)
	if err != nil {
		return 0, err
	}
	fwd, err := wmforwarder.NewForwarder(sub, pub, logger, wmforwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = fwd.Run(rctx) })
	start := time.Now()
	err = waitStream(ctx, cfg.Redis, dest, int64(cfg.Backlog), nil)
	elapsed := time.Since(start)
	cancel()
	_ = fwd.Close()
	wg.Wait()
	if err != nil {
		return 0, err
	}
	return float64(cfg.Backlog) / elapsed.Seconds(), nil
}

type latencyResult struct {
	n             int
	p50, p99, max time.Duration
}

// runLatency commits events at a steady rate, one per transaction, and
// measures from each commit's return to the entry's arrival on the stream,
// read by a blocking XREAD.
func runLatency(ctx context.Context, cfg ForwardConfig) (latencyResult, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 12)
	if err != nil {
		return latencyResult{}, err
	}
	defer drop()
	topic := "bench." + uuid.NewString()[:8]
	defer cfg.Redis.Del(context.WithoutCancel(ctx), topic)
	broker, err := redisstreams.New(redisstreams.Config{Client: cfg.Redis})
	if err != nil {
		return latencyResult{}, err
	}
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, Logger: quietLogger()})
	if err != nil {
		return latencyResult{}, err
	}
	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}})
	if err != nil {
		return latencyResult{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = f.Run(rctx) }()

	var committed sync.Map // message id -> when its commit returned
	total := int(cfg.Duration.Seconds() * float64(cfg.Rate))
	arrived := make(map[string]time.Time, total) // written by the reader only
	readerErr := make(chan error, 1)
	go func() {
		last := "$"
		got := 0
		for got < total {
			res, err := cfg.Redis.XRead(rctx, &redis.XReadArgs{Streams: []string{topic, last}, Block: 2 * time.Second, Count: 1000}).Result()
			if err == redis.Nil {
				continue
			}
			if err != nil {
				readerErr <- fmt.Errorf("read stream: %w", err)
				return
			}
			now := time.Now()
			for _, m := range res[0].Messages {
				last = m.ID
				id, _ := m.Values["_watermill_message_uuid"].(string)
				if _, dup := arrived[id]; !dup {
					arrived[id] = now
					got++
				}
			}
		}
		readerErr <- nil
	}()
	time.Sleep(500 * time.Millisecond) // the forwarder leases its partitions

	// Producers: a steady rate shared by 8 goroutines, each sending on a tick.
	tick := time.NewTicker(time.Second / time.Duration(cfg.Rate))
	defer tick.Stop()
	jobs := make(chan int, cfg.Rate)
	var wg sync.WaitGroup
	var prodErr atomic.Value
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				ev, err := events.New(ctx, events.Aggregate{Type: "payment", ID: fmt.Sprintf("agg-%d", i%500), Version: int64(i/500 + 1)},
					benchEvent{N: i})
				if err == nil {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writer.PublishTx(ctx, tx, ev) })
				}
				if err != nil {
					prodErr.Store(err)
					continue
				}
				committed.Store(ev.MessageID, time.Now())
			}
		})
	}
	for i := range total {
		<-tick.C
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if e, ok := prodErr.Load().(error); ok {
		return latencyResult{}, fmt.Errorf("produce: %w", e)
	}
	if err := <-readerErr; err != nil {
		return latencyResult{}, err
	}
	var lat []time.Duration
	committed.Range(func(k, v any) bool {
		if at, ok := arrived[k.(string)]; ok {
			// An entry can arrive before its producer saw the commit
			// return: that is a latency of zero, not a negative one.
			lat = append(lat, max(at.Sub(v.(time.Time)), 0))
		}
		return true
	})
	slices.Sort(lat)
	return latencyResult{n: len(lat), p50: quantile(lat, 0.5), p99: quantile(lat, 0.99), max: lat[len(lat)-1]}, nil
}

// benchEvent is the latency run's payload. Events of one aggregate are
// committed by different goroutines here, so their versions are only
// labels: order is not what this run measures.
type benchEvent struct {
	N int `json:"n"`
}

func (benchEvent) EventType() string { return "bench.event" }
