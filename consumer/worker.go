package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
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
	// aggregate's version. Empty means every type.
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
	// message parked for retry; messages applied later by the retry loop
	// do not call it. It must not block.
	Committed func()
}

// WorkerConfig configures a [Worker].
type WorkerConfig struct {
	// Pool is the consumers' database. Required.
	Pool *pgxpool.Pool
	// Broker is the backend the handlers read from (see package brokers);
	// the worker does not close it. Nil means Redis Streams at RedisURL.
	Broker brokers.Backend
	// RedisURL is where the streams are when Broker is nil.
	RedisURL string
	// Registry decodes events. Required.
	Registry *events.Registry
	// StreamPartitions must match the forwarder's (when Broker is nil; a
	// Broker has its own). Defaults to 1.
	StreamPartitions int
	// StreamPrefix must match the forwarder's. Defaults to "".
	StreamPrefix string
	// ClaimIdle is how long a delivered message may stay unacknowledged
	// before another consumer of the group claims it: a dead worker's
	// messages are redelivered after it. Keep it above the slowest
	// handler. Defaults to 30s.
	ClaimIdle time.Duration
	// BatchSize is how many stream entries one read takes and hands to the
	// handler at once; the idempotency middleware shares one transaction
	// among the messages it handles together (up to
	// Idempotency.MaxBatch). Defaults to 100.
	BatchSize int
	// Idempotency is the base configuration of every handler's consumer
	// (retries, gaps, MaxBatch); Pool, Consumer and Ordering are set per
	// handler.
	Idempotency idempotency.Config
	// InstanceID names this process in the consumer groups. Defaults to a
	// random id.
	InstanceID string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Worker runs handlers.
type Worker struct {
	cfg      WorkerConfig
	handlers []Handler
}

// NewWorker validates cfg.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("worker config: Pool is required")
	case cfg.Broker == nil && cfg.RedisURL == "":
		return nil, errors.New("worker config: Broker or RedisURL is required")
	case cfg.Registry == nil:
		return nil, errors.New("worker config: Registry is required")
	}
	if cfg.StreamPartitions == 0 {
		cfg.StreamPartitions = 1
	}
	if cfg.ClaimIdle == 0 {
		cfg.ClaimIdle = 30 * time.Second
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 100
	}
	if cfg.BatchSize < 1 {
		return nil, errors.New("worker config: BatchSize must be at least 1")
	}
	if cfg.InstanceID == "" {
		host, _ := os.Hostname()
		cfg.InstanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Worker{cfg: cfg}, nil
}

// Add registers a handler. Call it before Run.
func (w *Worker) Add(h Handler) error {
	switch {
	case h.Name == "" || h.Topic == "" || h.Func == nil:
		return errors.New("handler: Name, Topic and Func are required")
	case slices.ContainsFunc(w.handlers, func(o Handler) bool { return o.Name == h.Name }):
		return fmt.Errorf("handler %q: the name is taken", h.Name)
	}
	w.handlers = append(w.handlers, h)
	return nil
}

// Run consumes until ctx is done, then lets the messages in flight finish.
// It fails at start when Redis is unreachable.
func (w *Worker) Run(ctx context.Context) error {
	logger := watermill.NewSlogLogger(w.cfg.Logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(middleware.Recoverer)

	backend := w.cfg.Broker
	if backend == nil {
		if backend, err = brokers.Open(ctx, brokers.Config{Kind: brokers.Redis, Partitions: w.cfg.StreamPartitions,
			Redis: brokers.RedisConfig{URL: w.cfg.RedisURL, StreamPrefix: w.cfg.StreamPrefix}, Logger: w.cfg.Logger}); err != nil {
			return err
		}
		defer backend.Close()
	}
	var (
		clients   []interface{ Close() error }
		consumers []*idempotency.Consumer
	)
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for _, h := range w.handlers {
		icfg := w.cfg.Idempotency
		icfg.Pool, icfg.Consumer, icfg.Ordering = w.cfg.Pool, h.Name, h.Ordering
		if !h.BaselineBefore.IsZero() {
			icfg.BaselineBefore = h.BaselineBefore
		}
		if icfg.Logger == nil {
			icfg.Logger = w.cfg.Logger
		}
		consumer, err := idempotency.NewConsumer(icfg)
		if err != nil {
			return fmt.Errorf("handler %q: %w", h.Name, err)
		}
		consumers = append(consumers, consumer)
		fn := consumer.Middleware(w.handlerFunc(h))
		sub, err := backend.Subscriber(h.Name, w.cfg.InstanceID, brokers.SubscriberOptions{
			InFlight: w.cfg.BatchSize, ClaimIdle: w.cfg.ClaimIdle})
		if err != nil {
			return err
		}
		clients = append(clients, sub)
		for _, stream := range backend.Topics(h.Topic) {
			router.AddConsumerHandler(h.Name+"@"+stream, stream, sub, func(msg *message.Message) error {
				_, err := fn(msg)
				if err == nil && h.Committed != nil && listed(h, msg) {
					h.Committed()
				}
				return err
			})
		}
	}

	var wg sync.WaitGroup
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, c := range consumers {
		wg.Go(func() { _ = c.Run(rctx) })
	}
	err = router.Run(ctx)
	if err != nil && ctx.Err() != nil {
		// Stopped while still subscribing: a subscription that the stop
		// interrupted is not a failure.
		err = nil
	}
	cancel()
	wg.Wait()
	return err
}

// handlerFunc decodes the event and calls h.Func with the middleware's
// transaction. Types h does not list are acknowledged unseen (their
// version still counts).
func (w *Worker) handlerFunc(h Handler) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if !listed(h, msg) {
			return nil, nil
		}
		ev, err := w.cfg.Registry.DecodeMessage(msg)
		if err != nil {
			return nil, err
		}
		tx, ok := idempotency.Tx(msg.Context())
		if !ok {
			return nil, errors.New("consumer: no transaction in the message context")
		}
		return nil, h.Func(msg.Context(), tx, ev)
	}
}

// listed reports whether h receives msg's event type.
func listed(h Handler, msg *message.Message) bool {
	return len(h.EventTypes) == 0 || slices.Contains(h.EventTypes, msg.Metadata.Get(events.EventTypeKey))
}
