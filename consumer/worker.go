package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/instanceid"
)

// Func handles one event inside the consumer's transaction tx.
type Func func(ctx context.Context, tx pgx.Tx, ev events.Event) error

// Handler is one consumer.
type Handler struct {
	// Name is the consumer's name: its consumer group and its
	// deduplication key. Required, unique.
	Name string
	// Topic is the topic it reads. Required.
	Topic string
	// EventTypes lists the types Func receives; others only advance the
	// aggregate's version. Empty means every type. Each must be in the
	// worker's Registry: Add refuses a type it does not know
	// ([ErrUnknownEventType]), the typo that would otherwise leave the
	// handler silently idle. [On] and [OnEach] set it from the payload
	// types their functions take.
	EventTypes []string
	// Ordering defaults to idempotency.Strict.
	Ordering idempotency.Ordering
	// BaselineBefore, when set, is this handler's
	// idempotency.Config.BaselineBefore, whatever the worker's: set it to
	// the time a handler added to a running system is first deployed, so
	// that it starts from what the streams still hold instead of
	// dead-lettering every aggregate whose first versions were trimmed.
	BaselineBefore time.Time
	// Func is the handler. Required.
	Func Func
	// Committed, when set, is called after a message of a listed type was
	// handled and its transaction committed (the idempotency middleware
	// returns only then, a shared transaction included), outside it: the
	// place to wake in-process work that reads what Func wrote, such as
	// NotifyMerchant's Sender. It may also be called for a duplicate or a
	// message dead-lettered for retry; messages applied later by the retry loop
	// do not call it. It must not block.
	Committed func()
	// NoReplay turns off the handler's replay subscription (see the package
	// doc): it then reads Topic only, and `outflow replay` to it delivers
	// nothing. For a handler on a broker where one more topic per consumer
	// group costs (a Kafka topic, a polled sql table), or whose effects an
	// operator must never re-drive.
	NoReplay bool
	// Middleware wraps this handler only, inside WorkerConfig.Middleware
	// and, like it, outside the idempotency middleware (see the package
	// doc for the order).
	Middleware []message.HandlerMiddleware

	// Per-handler settings. Each overrides the worker's when set (non-zero)
	// and defaults to it.

	// BatchSize overrides WorkerConfig.BatchSize for this handler.
	BatchSize int
	// ClaimIdle overrides WorkerConfig.ClaimIdle for this handler: keep it
	// above this handler's slowest message.
	ClaimIdle time.Duration
	// Idempotency overrides WorkerConfig.Idempotency field by field: a
	// field set here (non-zero) wins, the others are the worker's. Pool and
	// Consumer are ignored (the worker's Pool, the handler's Name).
	Idempotency idempotency.Config

	// payloads, set by On and OnEach, is the Go type each listed event
	// type's function takes: Add checks it against the registry, so a
	// payload registered under another type fails at start-up, not per
	// message.
	payloads map[string]reflect.Type
	// err is On's or OnEach's construction error, which Add reports: they
	// return a Handler, so that one reads like a Handler literal.
	err error
}

// WorkerConfig configures a [Worker].
type WorkerConfig struct {
	// Pool is the consumers' database. Required.
	Pool *pgxpool.Pool
	// Broker is the backend the handlers read from, opened by the caller
	// (brokers.Open, with the forwarder's partitions and prefix); the worker
	// does not close it. Required: the worker links no broker client of its
	// own, so a service links only the one it opens.
	Broker brokers.Backend
	// Registry decodes events; every type a handler lists must be in it.
	// Required.
	Registry *events.Registry
	// ClaimIdle is how long a delivered message may stay unacknowledged
	// before another consumer of the group claims it: a dead worker's
	// messages are redelivered after it. Keep it above the slowest
	// handler. Defaults to brokers.DefaultClaimIdle.
	ClaimIdle time.Duration
	// BatchSize is how many stream entries one read takes and hands to the
	// handler at once; the idempotency middleware shares one transaction
	// among the messages it handles together (up to
	// Idempotency.MaxBatch). Defaults to 100.
	BatchSize int
	// Idempotency is the default configuration of every handler's
	// consumer (retries, gaps, MaxBatch), which a Handler's Idempotency
	// overrides field by field; Pool, Consumer and Ordering are set per
	// handler (its Ordering is Handler.Ordering, or its
	// Idempotency.Ordering, never the worker's).
	Idempotency idempotency.Config
	// Middleware is the caller's Watermill middleware (metrics, timeouts,
	// throttling, tracing), run around every handler of the worker in the
	// order given, outside the idempotency middleware: it sees the whole
	// handling, transaction and commit included, and its context reaches
	// the handler. See the package doc.
	Middleware []message.HandlerMiddleware
	// Plugins are Watermill router plugins, run when Run starts its router.
	// Run only: with AddTo, add them to your router.
	Plugins []message.RouterPlugin
	// Router configures the router Run builds. CloseTimeout defaults to
	// 30s. Run only.
	Router message.RouterConfig
	// InstanceID names this process in the consumer groups. Defaults to a
	// random id.
	InstanceID string
	// Bodies is where the handlers fetch the payloads that travel by
	// reference (events/outbox Config.ClaimCheck): resolved before
	// decoding, verified against their sha256 and size, never stored in
	// a dead letter (which keeps the reference). Nil: the default
	// PostgreSQL store read in the handler's own transaction, for bodies
	// in the consumers' database (Pool, the producer's, as in the
	// reference app); its role must be granted outflow_claim_reader.
	// Set it (claimcheck.Postgres{DB: producerPool}) when the producer's
	// database is another.
	Bodies claimcheck.Store
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets every handler's metrics: the
	// idempotency counters (Idempotency.Metrics defaults to it) and the
	// lag gauges, sampled every LagInterval from a broker that reports
	// lag (brokers.LagReporter). Nil: no metrics.
	Registerer prometheus.Registerer
	// LagInterval is how often the lag gauges are sampled. Defaults to 15s.
	LagInterval time.Duration
}

// Worker runs handlers.
type Worker struct {
	cfg      WorkerConfig
	handlers []Handler
	router   atomic.Pointer[message.Router] // Run's, while it runs: see Ready
}

func (c *WorkerConfig) setDefaults() {
	c.ClaimIdle = cmp.Or(c.ClaimIdle, brokers.DefaultClaimIdle)
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.Router.CloseTimeout = cmp.Or(c.Router.CloseTimeout, 30*time.Second)
	if c.InstanceID == "" {
		c.InstanceID = instanceid.New() // not cmp.Or: only when needed
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.LagInterval = cmp.Or(c.LagInterval, 15*time.Second)
}

func (c *WorkerConfig) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Pool != nil, "Pool", "is required")
	check(c.Broker != nil, "Broker", "is required (open one with brokers.Open)")
	check(c.Registry != nil, "Registry", "is required")
	check(c.BatchSize >= 1, "BatchSize", "must be at least 1")
	check(c.ClaimIdle > 0, "ClaimIdle", "must be positive")
	check(c.LagInterval > 0, "LagInterval", "must be positive")
	check(!slices.ContainsFunc(c.Middleware, func(m message.HandlerMiddleware) bool { return m == nil }), "Middleware", "holds a nil middleware")
	check(!slices.ContainsFunc(c.Plugins, func(p message.RouterPlugin) bool { return p == nil }), "Plugins", "holds a nil plugin")
	if err := c.Router.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Router: %w", err))
	}
	if c.Pool != nil { // the consumer needs one; its absence is reported above
		icfg := c.Idempotency
		icfg.Pool, icfg.Consumer, icfg.Metrics = c.Pool, "worker", nil // validation only: no series
		if _, err := idempotency.NewConsumer(icfg); err != nil {
			errs = append(errs, fmt.Errorf("Idempotency: %w", err))
		}
	}
	return errs.Err("worker config")
}

// NewWorker validates cfg.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Worker{cfg: cfg}, nil
}

// Add registers a handler. Call it before Run or AddTo. It validates the
// handler's settings merged with the worker's, and its event types against
// the Registry (see [Handler.CheckTypes]); an error names the handler and
// the field or the event type.
func (w *Worker) Add(h Handler) error {
	switch {
	case h.Name == "" || h.Topic == "" || h.Func == nil:
		return errors.New("handler: Name, Topic and Func are required")
	case slices.ContainsFunc(w.handlers, func(o Handler) bool { return o.Name == h.Name }):
		return fmt.Errorf("handler %q: the name is taken", h.Name)
	case slices.ContainsFunc(h.Middleware, func(m message.HandlerMiddleware) bool { return m == nil }):
		return fmt.Errorf("handler %q: Middleware holds a nil middleware", h.Name)
	}
	if err := h.CheckTypes(w.cfg.Registry); err != nil {
		return err
	}
	if _, err := w.settings(h); err != nil {
		return err
	}
	w.handlers = append(w.handlers, h)
	return nil
}

// settings are one handler's effective settings: its own where set, the
// worker's otherwise.
type settings struct {
	BatchSize   int
	ClaimIdle   time.Duration
	Idempotency idempotency.Config
}

// settings merges h's settings over the worker's and validates them.
func (w *Worker) settings(h Handler) (settings, error) {
	s := settings{BatchSize: w.cfg.BatchSize, ClaimIdle: w.cfg.ClaimIdle, Idempotency: w.cfg.Idempotency}
	switch {
	case h.BatchSize < 0:
		return s, fmt.Errorf("handler %q: BatchSize must be at least 1", h.Name)
	case h.ClaimIdle < 0:
		return s, fmt.Errorf("handler %q: ClaimIdle must be positive", h.Name)
	}
	if h.BatchSize > 0 {
		s.BatchSize = h.BatchSize
	}
	if h.ClaimIdle > 0 {
		s.ClaimIdle = h.ClaimIdle
	}
	s.Idempotency = mergeIdempotency(w.cfg.Idempotency, h.Idempotency)
	i := &s.Idempotency
	i.Pool, i.Consumer = w.cfg.Pool, h.Name
	i.Ordering = h.Ordering
	if h.Idempotency.Ordering != idempotency.Strict {
		i.Ordering = h.Idempotency.Ordering
	}
	if !h.BaselineBefore.IsZero() {
		i.BaselineBefore = h.BaselineBefore
	}
	if i.Logger == nil {
		i.Logger = w.cfg.Logger
	}
	if i.Metrics == nil {
		i.Metrics = w.cfg.Registerer
	}
	i.Topic = h.Topic
	if _, err := idempotency.NewConsumer(*i); err != nil {
		return s, fmt.Errorf("handler %q: %w", h.Name, err)
	}
	return s, nil
}

// mergeIdempotency returns base with every field that over sets
// (non-zero): a field added to idempotency.Config is merged without a
// line here.
func mergeIdempotency(base, over idempotency.Config) idempotency.Config {
	b, o := reflect.ValueOf(&base).Elem(), reflect.ValueOf(over)
	for i := range o.NumField() {
		if f := o.Field(i); !f.IsZero() {
			b.Field(i).Set(f)
		}
	}
	return base
}

// Run consumes until ctx is done, then lets the messages in flight finish.
// It builds a router of its own (WorkerConfig.Router, Plugins and
// Middleware); to run the handlers on a router of yours, use AddTo. It
// fails at start when the broker is unreachable.
func (w *Worker) Run(ctx context.Context) error {
	router, err := message.NewRouter(w.cfg.Router, watermill.NewSlogLogger(w.cfg.Logger))
	if err != nil {
		return fmt.Errorf("consumer: new router: %w", err)
	}
	// Outermost: a panic anywhere below, the caller's middleware
	// included, becomes an error.
	router.AddMiddleware(middleware.Recoverer)
	router.AddMiddleware(w.cfg.Middleware...)
	router.AddPlugin(w.cfg.Plugins...)

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a, err := w.attach(rctx, router, nil)
	if err != nil {
		return err
	}
	defer a.close()
	w.router.Store(router)
	defer w.router.Store(nil)
	err = router.Run(ctx)
	if err != nil && ctx.Err() != nil {
		// Stopped while still subscribing: a subscription that the stop
		// interrupted is not a failure.
		err = nil
	}
	cancel()
	a.wait()
	return err
}

// AddTo adds the worker's handlers to router, a Watermill router of the
// caller's, so that they run with its middleware and plugins, beside its
// other handlers. WorkerConfig.Middleware and each Handler's Middleware are
// added as handler-level middleware of the worker's handlers; the router's
// own middleware, whenever added, wraps them too, and every one of them
// runs outside the idempotency middleware (see the package doc).
// WorkerConfig.Plugins and Router are Run's: AddTo refuses Plugins.
//
// AddTo starts the idempotency retry loops, which run until ctx is done or
// stop is called; when router is already running, it starts the handlers
// too (RunHandlers, with ctx: they stop when ctx is done), else router.Run
// will. Call stop once the router has
// stopped: it stops the retry loops, waits for them and closes the
// subscribers (not the broker: it is the caller's).
func (w *Worker) AddTo(ctx context.Context, router *message.Router) (stop func(), err error) {
	if router == nil {
		return nil, errors.New("consumer: AddTo: router is nil")
	}
	if len(w.cfg.Plugins) > 0 {
		return nil, errors.New("consumer: AddTo: WorkerConfig.Plugins are for Run: add them to your router")
	}
	rctx, cancel := context.WithCancel(ctx)
	a, err := w.attach(rctx, router, w.cfg.Middleware)
	if err != nil {
		cancel()
		return nil, err
	}
	if router.IsRunning() {
		if err := router.RunHandlers(ctx); err != nil {
			cancel()
			a.wait()
			a.close()
			return nil, fmt.Errorf("consumer: AddTo: run handlers: %w", err)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			a.wait()
			a.close()
		})
	}, nil
}

// attached is what attach opened and started.
type attached struct {
	wg      sync.WaitGroup
	closers []func() error
}

// wait waits for the retry loops, once their context is done.
func (a *attached) wait() { a.wg.Wait() }

// close closes the subscribers.
func (a *attached) close() {
	for _, c := range a.closers {
		_ = c()
	}
}

// attach adds every handler to router, with mw and its own middleware as
// handler-level middleware, and starts the retry loops with ctx. On error,
// it has stopped and closed what it started.
func (w *Worker) attach(ctx context.Context, router *message.Router, mw []message.HandlerMiddleware) (_ *attached, err error) {
	a := &attached{}
	defer func() {
		if err != nil {
			a.wait()
			a.close()
		}
	}()
	backend := w.cfg.Broker
	// Watermill panics on a taken handler name: check them all before
	// adding any.
	taken := router.Handlers()
	for _, h := range w.handlers {
		for _, stream := range w.streams(backend, h) {
			if _, ok := taken[h.Name+"@"+stream]; ok {
				return nil, fmt.Errorf("handler %q: the router has a handler named %q already", h.Name, h.Name+"@"+stream)
			}
		}
	}
	var consumers []*idempotency.Consumer
	for _, h := range w.handlers {
		s, err := w.settings(h)
		if err != nil {
			return nil, err
		}
		c, err := idempotency.NewConsumer(s.Idempotency)
		if err != nil {
			return nil, fmt.Errorf("handler %q: %w", h.Name, err)
		}
		consumers = append(consumers, c)
		fn := c.Middleware(w.handlerFunc(h, string(backend.Kind())))
		sub, err := backend.Subscriber(h.Name, w.cfg.InstanceID, brokers.SubscriberOptions{
			InFlight: s.BatchSize, ClaimIdle: s.ClaimIdle})
		if err != nil {
			return nil, fmt.Errorf("handler %q: subscribe: %w", h.Name, err)
		}
		a.closers = append(a.closers, sub.Close)
		for _, stream := range w.streams(backend, h) {
			wh := router.AddConsumerHandler(h.Name+"@"+stream, stream, sub, func(msg *message.Message) error {
				_, err := fn(msg)
				if err == nil && h.Committed != nil && listed(h, msg) {
					h.Committed()
				}
				return err
			})
			wh.AddMiddleware(mw...)
			wh.AddMiddleware(h.Middleware...)
		}
	}
	for _, c := range consumers {
		a.wg.Go(func() { _ = c.Run(ctx) })
	}
	if lr, ok := backend.(brokers.LagReporter); ok && w.cfg.Registerer != nil && len(w.handlers) > 0 {
		g, err := newLagGauges(w.cfg.Registerer)
		if err != nil {
			return nil, err
		}
		a.wg.Go(func() { w.sampleLag(ctx, lr, g) })
	}
	return a, nil
}

// streams lists the broker topics h reads: its topic's partitions, then
// its replay topic (one broker topic), unless NoReplay. Same subscriber,
// group and middleware chain for all: a replayed message is deduplicated
// and ordered by version like any other.
func (w *Worker) streams(b brokers.Backend, h Handler) []string {
	streams := b.Topics(h.Topic)
	if !h.NoReplay {
		streams = append(streams, ReplayBrokerTopic(b, h.Name))
	}
	return streams
}

// handlerFunc decodes the event and calls h.Func with the middleware's
// transaction. Types h does not list are acknowledged unseen (their
// version still counts). A panic in h.Func is its error: the idempotency
// middleware dead-letters the message for a retry, as for any failure.
// It runs in h's handling span (see startSpan); system is the backend's
// kind.
func (w *Worker) handlerFunc(h Handler, system string) message.HandlerFunc {
	return func(msg *message.Message) (_ []*message.Message, err error) {
		if !listed(h, msg) {
			return nil, nil
		}
		tx, ok := idempotency.Tx(msg.Context())
		if !ok {
			return nil, errors.New("consumer: no transaction in the message context")
		}
		// A body by reference is fetched here, for listed types only: the
		// others never cost a fetch. msg keeps the reference, so a dead
		// letter does too.
		dm, err := w.resolveBody(msg.Context(), tx, msg)
		if err != nil {
			return nil, fmt.Errorf("handler %q: %w", h.Name, err)
		}
		ev, err := w.cfg.Registry.DecodeMessage(dm)
		if err != nil {
			return nil, err
		}
		ctx, span := startSpan(msg.Context(), h, system, msg)
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("handler %q panicked: %v", h.Name, r)
			}
			endSpan(span, err)
		}()
		return nil, h.Func(ctx, tx, ev)
	}
}

// resolveBody returns msg with its body when it travels by reference:
// from cfg.Bodies, or read in tx.
func (w *Worker) resolveBody(ctx context.Context, tx pgx.Tx, msg *message.Message) (*message.Message, error) {
	if w.cfg.Bodies != nil {
		return claimcheck.Resolve(ctx, w.cfg.Bodies, msg)
	}
	return claimcheck.ResolveTx(ctx, tx, msg)
}

// Wants reports whether the handler's Func receives events of eventType:
// every type when EventTypes is empty. The others only advance their
// aggregate's version.
func (h Handler) Wants(eventType string) bool {
	return len(h.EventTypes) == 0 || slices.Contains(h.EventTypes, eventType)
}

// listed reports whether h receives msg's event type.
func listed(h Handler, msg *message.Message) bool {
	return h.Wants(msg.Metadata.Get(events.EventTypeKey))
}
