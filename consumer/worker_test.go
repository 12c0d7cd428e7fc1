package consumer_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// orderPlaced is the tests' own event: the consumer package knows no
// application's events.
type orderPlaced struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
	// Note is large in the claim check's tests.
	Note string `json:"note,omitempty"`
}

func (orderPlaced) EventType() string { return "order.placed" }

const ordersTopic = "orders"

// rig is one test's database schema and Redis streams.
type rig struct {
	schema *outflowtest.Schema
	rdb    *redis.Client
	prefix string
	broker *redisstreams.Broker
	// backend is the worker's: the same streams as broker.
	backend brokers.Backend
	reg     *events.Registry
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{schema: outflowtest.NewSchema(t), rdb: testservers.Redis(t), reg: events.NewRegistry()}
	r.prefix = testservers.UniqueName(t, r.rdb) + ":"
	var err error
	r.broker, err = redisstreams.New(redisstreams.Config{Client: r.rdb, StreamPrefix: r.prefix})
	require.NoError(t, err)
	r.backend, err = brokers.Open(context.Background(), brokers.Config{Kind: brokers.Redis, Logger: quiet,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: r.prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.backend.Close() })
	require.NoError(t, r.reg.Register(orderPlaced{}))
	_, err = r.schema.Pool.Exec(context.Background(),
		`CREATE TABLE handled (consumer text NOT NULL, message_id text NOT NULL, PRIMARY KEY (consumer, message_id))`)
	require.NoError(t, err)
	return r
}

// publish appends one order.placed event per order id, version 1, and
// returns their message ids.
func (r *rig) publish(t *testing.T, orderIDs ...string) []string {
	t.Helper()
	var (
		out []forwarder.Outgoing
		ids []string
	)
	for _, id := range orderIDs {
		ev, err := events.New(context.Background(), events.Aggregate{Type: "order", ID: id, Version: 1}, orderPlaced{OrderID: id, Amount: 10})
		require.NoError(t, err)
		msg, err := ev.Message(context.Background())
		require.NoError(t, err)
		out = append(out, forwarder.Outgoing{Topic: ordersTopic, AggregateID: id, Message: msg})
		ids = append(ids, ev.MessageID)
	}
	for i, err := range r.broker.Publish(context.Background(), out) {
		require.NoError(t, err, "publish %s", orderIDs[i])
	}
	return ids
}

// unopened is a Backend for tests that never reach the broker (config and
// handler validation): any call of it panics.
type unopened struct{ brokers.Backend }

func (r *rig) config() consumer.WorkerConfig {
	return consumer.WorkerConfig{Pool: r.schema.Pool, Broker: r.backend, Registry: r.reg, Logger: quiet}
}

// record is a handler's effect: a row per message, in its transaction.
func record(name string) consumer.Func {
	return func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO handled (consumer, message_id) VALUES ($1, $2)`, name, ev.MessageID)
		return err
	}
}

// handled reports whether consumer's effect of message id is committed.
func (r *rig) handled(t *testing.T, consumer, id string) bool {
	t.Helper()
	var n int
	require.NoError(t, r.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM handled WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&n))
	return n == 1
}

func (r *rig) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, r.schema.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// run runs w until the test ends.
func run(t *testing.T, w *consumer.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

type ctxKey struct{}

// observer is a user's middleware (metrics, say): it counts messages, puts
// a value in their context and, once the inner handler returned, looks
// whether the effect is committed already.
type observer struct {
	r         *rig
	consumer  string
	mu        sync.Mutex
	calls     int
	committed map[string]bool
}

func (o *observer) middleware(t *testing.T) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if msg.Metadata.Get(events.EventTypeKey) == "" {
				return h(msg) // not an event: a message of the caller's own handler
			}
			msg.SetContext(context.WithValue(msg.Context(), ctxKey{}, "seen by "+o.consumer))
			out, err := h(msg)
			committed := o.r.handled(t, o.consumer, msg.UUID)
			o.mu.Lock()
			defer o.mu.Unlock()
			o.calls++
			if o.committed == nil {
				o.committed = map[string]bool{}
			}
			o.committed[msg.UUID] = committed
			return out, err
		}
	}
}

func (o *observer) seen() (int, map[string]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls, o.committed
}

// The worker runs the caller's middleware and plugins, outside the
// idempotency middleware: a metrics middleware sees the handling whole,
// commit included; its context and a Timeout's deadline reach the handler.
func TestWorkerRunsUserMiddlewareAndPlugins(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	obs := &observer{r: r, consumer: "audit"}
	var (
		pluginRuns  atomic.Int32
		pluginCalls atomic.Int32
		sawValue    atomic.Int32
		sawDeadline atomic.Int32
	)
	cfg := r.config()
	cfg.Middleware = []message.HandlerMiddleware{obs.middleware(t), middleware.Timeout(time.Minute)}
	cfg.Plugins = []message.RouterPlugin{func(router *message.Router) error {
		pluginRuns.Add(1)
		// A plugin gets the worker's real router: what it adds applies.
		router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				pluginCalls.Add(1)
				return h(msg)
			}
		})
		return nil
	}}
	cfg.Router = message.RouterConfig{CloseTimeout: 5 * time.Second}
	w, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	write := record("audit")
	require.NoError(t, w.Add(consumer.Handler{Name: "audit", Topic: ordersTopic,
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			if ctx.Value(ctxKey{}) == "seen by audit" {
				sawValue.Add(1)
			}
			if _, ok := ctx.Deadline(); ok {
				sawDeadline.Add(1)
			}
			return write(ctx, tx, ev)
		}}))
	run(t, w)

	ids := r.publish(t, "o-1", "o-2", "o-3")
	outflowtest.WaitFor(t, 20*time.Second, "the middleware to see every message handled", func() bool {
		n, _ := obs.seen()
		return n == len(ids)
	})
	_, committed := obs.seen()
	for _, id := range ids {
		require.True(t, committed[id], "message %s: the effect was committed when the inner handler returned to the middleware", id)
	}
	require.Equal(t, int32(1), pluginRuns.Load(), "the plugin ran once, at start")
	require.Equal(t, int32(len(ids)), pluginCalls.Load(), "the plugin's middleware ran on every message")
	require.Equal(t, int32(len(ids)), sawValue.Load(), "the middleware's context reached the handler")
	require.Equal(t, int32(len(ids)), sawDeadline.Load(), "the Timeout's deadline reached the handler")
}

// A handler that overruns a Timeout middleware's deadline and then returns
// nil has its effects committed once: the deadline bounds the handler, not
// the commit. With a transaction per message (MaxBatch 1) and shared ones.
func TestTimeoutMiddlewareDoesNotBreakTheTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		maxBatch int
	}{{"own transaction", 1}, {"shared transaction", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			cfg := r.config()
			cfg.Middleware = []message.HandlerMiddleware{middleware.Timeout(200 * time.Millisecond)}
			w, err := consumer.NewWorker(cfg)
			require.NoError(t, err)
			var calls atomic.Int32
			write := record("slow")
			require.NoError(t, w.Add(consumer.Handler{Name: "slow", Topic: ordersTopic,
				// No retry within the test: a parked message stays parked.
				Idempotency: idempotency.Config{MaxBatch: tc.maxBatch, RetryBackoff: time.Hour, RetryBackoffMax: time.Hour},
				Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
					calls.Add(1)
					// Work that ignores the deadline, then success: its
					// write too, which on a loaded machine may start after
					// the 200 ms (the bookkeeping before the handler took
					// them), and would fail as the handler's own error.
					if err := write(context.WithoutCancel(ctx), tx, ev); err != nil {
						return err
					}
					<-ctx.Done()
					return nil
				}}))
			run(t, w)

			id := r.publish(t, "o-1")[0]
			parked := func() int {
				return r.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = 'slow'`)
			}
			outflowtest.WaitFor(t, 20*time.Second, "the message committed or parked", func() bool {
				return r.handled(t, "slow", id) || parked() > 0
			})
			require.True(t, r.handled(t, "slow", id), "the handler's effect is committed")
			require.Zero(t, parked(), "nothing parked for a retry")
			require.Equal(t, int32(1), calls.Load())
		})
	}
}

// A handler that honours the deadline fails with it: its effects roll back
// and the message is parked for a retry.
func TestTimeoutMiddlewareFailsAHandlerThatHonoursIt(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	cfg := r.config()
	cfg.Middleware = []message.HandlerMiddleware{middleware.Timeout(200 * time.Millisecond)}
	w, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	write := record("careful")
	require.NoError(t, w.Add(consumer.Handler{Name: "careful", Topic: ordersTopic,
		Idempotency: idempotency.Config{RetryBackoff: time.Hour, RetryBackoffMax: time.Hour},
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			if err := write(ctx, tx, ev); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		}}))
	run(t, w)

	id := r.publish(t, "o-1")[0]
	outflowtest.WaitFor(t, 20*time.Second, "the message parked", func() bool {
		return r.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = 'careful' AND status = 'retrying'`) == 1
	})
	require.False(t, r.handled(t, "careful", id), "the effect rolled back")
}

// Each handler's settings override the worker's: here the idempotency
// retries (one handler gives up at once, the other retries) and ClaimIdle
// (a message left pending by a dead instance is claimed after the
// handler's ClaimIdle, not the worker's hour).
func TestPerHandlerSettings(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	cfg := r.config()
	cfg.ClaimIdle = time.Hour
	cfg.Idempotency = idempotency.Config{MaxAttempts: 5, RetryBackoff: time.Hour, RetryBackoffMax: time.Hour}
	w, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	fail := func(context.Context, pgx.Tx, events.Event) error { return errors.New("always fails") }
	require.NoError(t, w.Add(consumer.Handler{Name: "gives-up", Topic: ordersTopic, Func: fail,
		Idempotency: idempotency.Config{MaxAttempts: 1}}))
	require.NoError(t, w.Add(consumer.Handler{Name: "retries", Topic: ordersTopic, Func: fail}))
	require.NoError(t, w.Add(consumer.Handler{Name: "claims", Topic: ordersTopic, Func: record("claims"),
		ClaimIdle: 200 * time.Millisecond}))
	// BatchSize: "narrow" takes one message at a time, "wide" the worker's
	// 100, so the three messages of one read are in flight together.
	var narrow, wide inFlight
	require.NoError(t, w.Add(consumer.Handler{Name: "narrow", Topic: ordersTopic, Func: record("narrow"),
		BatchSize: 1, Middleware: []message.HandlerMiddleware{narrow.middleware(0)}}))
	require.NoError(t, w.Add(consumer.Handler{Name: "wide", Topic: ordersTopic, Func: record("wide"),
		Middleware: []message.HandlerMiddleware{wide.middleware(3)}}))

	// A dead instance of "claims" took the message and never acknowledged it.
	stream := r.broker.Streams(ordersTopic)[0]
	ctx := context.Background()
	require.NoError(t, r.rdb.XGroupCreateMkStream(ctx, stream, "claims", "0").Err())
	ids := r.publish(t, "o-1", "o-2", "o-3")
	id := ids[0]
	got, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "claims", Consumer: "dead", Streams: []string{stream, ">"}, Count: 1}).Result()
	require.NoError(t, err)
	require.Len(t, got[0].Messages, 1)
	run(t, w)

	status := func(consumer string) string {
		var s string
		err := r.schema.Pool.QueryRow(ctx, `SELECT status FROM dead_letters WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&s)
		if errors.Is(err, pgx.ErrNoRows) {
			return ""
		}
		require.NoError(t, err)
		return s
	}
	outflowtest.WaitFor(t, 20*time.Second, "both failing handlers to park the message", func() bool {
		return status("gives-up") != "" && status("retries") != ""
	})
	require.Equal(t, "dead", status("gives-up"), "the handler's MaxAttempts 1")
	require.Equal(t, "retrying", status("retries"), "the worker's MaxAttempts 5")
	outflowtest.WaitFor(t, 20*time.Second, "the pending message claimed after the handler's ClaimIdle", func() bool {
		return r.handled(t, "claims", id)
	})
	outflowtest.WaitFor(t, 20*time.Second, "narrow and wide to handle every message", func() bool {
		return r.count(t, `SELECT count(*) FROM handled WHERE consumer IN ('narrow', 'wide')`) == 2*len(ids)
	})
	require.Equal(t, int32(1), narrow.max.Load(), "the handler's BatchSize 1: one message in flight at a time")
	require.Equal(t, int32(3), wide.max.Load(), "the worker's BatchSize: the read's three messages together")
}

// inFlight is a handler-level middleware that tracks how many messages are
// in flight at once.
type inFlight struct {
	now, max atomic.Int32
	all      chan struct{}
	once     sync.Once
}

// middleware tracks the messages; with wait > 0, each waits (up to 10s)
// until wait of them are in flight together, so that a concurrency the
// broker allows is sure to show.
func (f *inFlight) middleware(wait int32) message.HandlerMiddleware {
	f.all = make(chan struct{})
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			n := f.now.Add(1)
			defer f.now.Add(-1)
			for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
			}
			if wait > 0 {
				if n >= wait {
					f.once.Do(func() { close(f.all) })
				}
				select {
				case <-f.all:
				case <-time.After(10 * time.Second):
				}
			}
			return h(msg)
		}
	}
}

// Invalid per-handler settings are refused by Add, naming the handler and
// the field.
func TestAddValidatesHandlerSettings(t *testing.T) {
	t.Parallel()
	r := &rig{schema: outflowtest.NewSchema(t), reg: events.NewRegistry()}
	base := consumer.WorkerConfig{Pool: r.schema.Pool, Broker: unopened{}, Registry: r.reg, Logger: quiet}
	nop := func(context.Context, pgx.Tx, events.Event) error { return nil }
	tests := []struct {
		name  string
		h     consumer.Handler
		field string
	}{
		{"batch size", consumer.Handler{BatchSize: -1}, "BatchSize"},
		{"claim idle", consumer.Handler{ClaimIdle: -time.Second}, "ClaimIdle"},
		{"attempts", consumer.Handler{Idempotency: idempotency.Config{MaxAttempts: -1}}, "MaxAttempts"},
		{"max batch", consumer.Handler{Idempotency: idempotency.Config{MaxBatch: -2}}, "MaxBatch"},
		{"gaps", consumer.Handler{Idempotency: idempotency.Config{GapRetryDelay: time.Hour, GapTimeout: time.Minute}}, "GapRetryDelay"},
		{"backoff", consumer.Handler{Idempotency: idempotency.Config{RetryBackoff: time.Hour}}, "RetryBackoff"},
		{"nil middleware", consumer.Handler{Middleware: []message.HandlerMiddleware{nil}}, "Middleware"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := consumer.NewWorker(base)
			require.NoError(t, err)
			h := tt.h
			h.Name, h.Topic, h.Func = "billing", ordersTopic, nop
			err = w.Add(h)
			require.Error(t, err)
			require.Contains(t, err.Error(), `handler "billing"`)
			require.Contains(t, err.Error(), tt.field)
			// The same settings are fine on another handler that does not
			// set them: the worker's defaults are valid.
			require.NoError(t, w.Add(consumer.Handler{Name: "other", Topic: ordersTopic, Func: nop}))
		})
	}

	withPlugin := base
	withPlugin.Plugins = []message.RouterPlugin{func(*message.Router) error { return nil }}
	w, err := consumer.NewWorker(withPlugin)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = w.AddTo(context.Background(), router)
	require.ErrorContains(t, err, "Plugins", "AddTo refuses plugins it could not run")

	bad := base
	bad.Idempotency = idempotency.Config{MaxAttempts: -1}
	_, err = consumer.NewWorker(bad)
	require.ErrorContains(t, err, "Idempotency")
	require.ErrorContains(t, err, "MaxAttempts")
}

// AddTo runs the handlers on the caller's router, beside its own handlers,
// with its middleware (added before or after AddTo) outside the idempotency
// middleware; on a router not yet running and on a running one.
func TestAddToUserRouter(t *testing.T) {
	t.Parallel()
	for _, running := range []bool{false, true} {
		name := map[bool]string{false: "before Run", true: "while running"}[running]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
			require.NoError(t, err)
			before := &observer{r: r, consumer: "audit"}
			router.AddMiddleware(before.middleware(t))

			// The caller's own handler, on an in-process pub/sub.
			pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = pubsub.Close() })
			var own atomic.Int32
			router.AddConsumerHandler("own", "own-topic", pubsub, func(*message.Message) error { own.Add(1); return nil })

			cfg := r.config()
			var workerMW atomic.Int32
			cfg.Middleware = []message.HandlerMiddleware{func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					workerMW.Add(1)
					return h(msg)
				}
			}}
			w, err := consumer.NewWorker(cfg)
			require.NoError(t, err)
			require.NoError(t, w.Add(consumer.Handler{Name: "audit", Topic: ordersTopic, Func: record("audit")}))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			start := func() {
				go func() { done <- router.Run(ctx) }()
				<-router.Running()
			}
			if running {
				start()
			}
			stop, err := w.AddTo(ctx, router)
			require.NoError(t, err)
			_, err = w.AddTo(ctx, router)
			require.ErrorContains(t, err, `handler "audit"`, "a second AddTo clashes by name, without a panic")
			// Added after AddTo, still outside the idempotency middleware.
			// (Watermill's AddMiddleware is not safe on a running router.)
			after := &observer{r: r, consumer: "audit"}
			observers := []*observer{before}
			if !running {
				router.AddMiddleware(after.middleware(t))
				observers = append(observers, after)
				start()
			}

			require.NoError(t, pubsub.Publish("own-topic", message.NewMessage(watermill.NewUUID(), nil)))
			ids := r.publish(t, "o-1", "o-2")
			outflowtest.WaitFor(t, 20*time.Second, "both messages handled and the caller's handler run", func() bool {
				n, _ := before.seen()
				return n == len(ids) && own.Load() == 1
			})
			for _, obs := range observers {
				n, committed := obs.seen()
				require.Equal(t, len(ids), n)
				for _, id := range ids {
					require.True(t, committed[id], "committed when the inner handler returned to the router's middleware")
				}
			}
			require.Equal(t, int32(len(ids)), workerMW.Load(), "WorkerConfig.Middleware ran on the worker's handlers only")

			require.NoError(t, router.Close())
			require.NoError(t, <-done)
			stop()
		})
	}
}

// A handler's panic is its failure: the message is parked for a retry, as
// for an error, whether it has a transaction of its own or shares one.
func TestHandlerPanicIsParked(t *testing.T) {
	t.Parallel()
	for _, maxBatch := range []int{1, 0} {
		t.Run(map[int]string{1: "own transaction", 0: "shared transaction"}[maxBatch], func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			w, err := consumer.NewWorker(r.config())
			require.NoError(t, err)
			require.NoError(t, w.Add(consumer.Handler{Name: "panics", Topic: ordersTopic,
				Idempotency: idempotency.Config{MaxBatch: maxBatch, RetryBackoff: time.Hour, RetryBackoffMax: time.Hour},
				Func:        func(context.Context, pgx.Tx, events.Event) error { panic("boom") }}))
			run(t, w)

			r.publish(t, "o-1")
			outflowtest.WaitFor(t, 20*time.Second, "the message parked", func() bool {
				return r.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = 'panics' AND status = 'retrying' AND error LIKE '%boom%'`) == 1
			})
		})
	}
}

// The worker opens no broker of its own: without one it says so at once,
// instead of failing at Run on a Redis nobody configured.
func TestNewWorkerRequiresABroker(t *testing.T) {
	t.Parallel()
	r := &rig{schema: outflowtest.NewSchema(t), reg: events.NewRegistry()}
	_, err := consumer.NewWorker(consumer.WorkerConfig{Pool: r.schema.Pool, Registry: r.reg, Logger: quiet})
	require.ErrorContains(t, err, "Broker: is required")
}
