package fanout

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/webhooks"
)

// Config configures the consumer handler [Handler] builds.
type Config struct {
	// Account returns the account ev belongs to, read from its payload
	// or looked up in tx (the handler's transaction). "" means the event
	// is no account's: it is skipped, nothing is recorded. An error fails
	// the handler, so the message is retried and then dead-lettered with
	// it: return one for an account the service does not know (the
	// reference app's unknown merchant) rather than dropping its events.
	// Required.
	Account func(ctx context.Context, tx pgx.Tx, ev events.Event) (string, error)
	// Wake, when set, is called after the transaction of a message that
	// recorded at least one pending delivery committed: the sender's Wake,
	// so that the delivery leaves at once rather than at the sender's next
	// poll. It must not block. It is not called for a duplicate, an event
	// no enabled endpoint wants, nor a message applied later by the
	// consumer's retry loop (the sender's poll finds those).
	Wake func()
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Handler returns the consumer handler named name that reads topic and
// records, in its transaction, one webhook message per event of
// eventTypes (none: every event on the topic) and a delivery per
// endpoint of the event's account that wants it, with [Enqueue]. The
// message is the event: its id (the webhook-id endpoints receive), type,
// time and payload; a redelivered event records nothing twice, and the
// consumer's idempotency keeps even that from running.
//
// The payload recorded is the decoded payload encoded again, so that it
// is at the registered type's schema version, which is the message's
// SchemaVersion (an older payload was upcast to it on decoding): the
// Renderer gets a payload and the version it is in, whatever the
// producer wrote.
//
// The handler wakes cfg.Wake through its Middleware (keep it when
// copying the handler into another): a Handler.Committed cannot tell
// which message it is called for, so a wake could come before the
// transaction that recorded the delivery committed, and none after it.
//
// A nil cfg.Account panics: it is a programming error, and a Handler
// holds no error for Worker.Add to report.
func Handler(name, topic string, cfg Config, eventTypes ...string) consumer.Handler {
	if cfg.Account == nil {
		panic(fmt.Sprintf("fanout handler %q: Config.Account is required", name))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := consumer.Handler{
		Name:       name,
		Topic:      topic,
		EventTypes: eventTypes,
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			return record(ctx, tx, name, cfg, ev)
		},
	}
	if cfg.Wake != nil {
		h.Middleware = []message.HandlerMiddleware{wakeAfterCommit(cfg.Wake)}
	}
	return h
}

// record is the handler's Func: the account, then the one statement.
func record(ctx context.Context, tx pgx.Tx, name string, cfg Config, ev events.Event) error {
	account, err := cfg.Account(ctx, tx, ev)
	if err != nil {
		return fmt.Errorf("fanout handler %q: account of %s %s: %w", name, ev.EventType, ev.MessageID, err)
	}
	if account == "" {
		cfg.Logger.DebugContext(ctx, "webhook fanout: event of no account skipped", "handler", name,
			"event_type", ev.EventType, "message_id", ev.MessageID)
		return nil
	}
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return fmt.Errorf("fanout handler %q: encode %s %s: %w", name, ev.EventType, ev.MessageID, err)
	}
	// The handler's span, when tracing is on; the event's own context
	// otherwise: the sender's request continues one of them.
	tp := events.Traceparent(ctx)
	if tp == "" {
		tp = ev.Traceparent
	}
	m := webhooks.Message{ID: ev.MessageID, AccountID: account, EventType: ev.EventType, OccurredAt: ev.OccurredAt,
		SchemaVersion: events.SchemaVersionOf(ev.Payload), Payload: payload}
	r, err := Enqueue(ctx, tx, m, Target{}, tp)
	if err != nil {
		return fmt.Errorf("fanout handler %q: %w", name, err)
	}
	if r.Pending > 0 {
		if p, ok := ctx.Value(pendingKey{}).(*atomic.Bool); ok {
			p.Store(true)
		}
	}
	return nil
}

// pendingKey keys, in a message's context, the flag record sets when the
// message recorded a pending delivery.
type pendingKey struct{}

// wakeAfterCommit is the handler's middleware: it runs outside the
// idempotency middleware, which returns only once the message's
// transaction committed (a shared one included), so a message whose
// handling recorded a pending delivery wakes the sender after that
// commit, and only then. The flag travels in the message's own context,
// which the handler's ctx derives from on every path that runs it.
func wakeAfterCommit(wake func()) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			var pending atomic.Bool
			mctx := msg.Context()
			msg.SetContext(context.WithValue(mctx, pendingKey{}, &pending))
			out, err := next(msg)
			msg.SetContext(mctx)
			if err == nil && pending.Load() {
				wake()
			}
			return out, err
		}
	}
}
