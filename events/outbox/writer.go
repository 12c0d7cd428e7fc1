package outbox

import (
	"cmp"
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/configcheck"
)

// ErrNoTransaction is returned when an event would be written outside an open
// transaction: a nil transaction, or one already committed or rolled back.
var ErrNoTransaction = errors.New("outbox: publish needs an open transaction")

// Config configures a [Writer].
type Config struct {
	// Routes maps event types to topics. Defaults to routing every event to
	// a topic named after its aggregate type.
	Routes Routes
	// Mode chooses rows of the outbox table ([ModeTable], the default) or
	// logical decoding messages ([ModeWAL]) read by the WAL relay. The
	// methods and their guarantees are the same in both.
	Mode Mode
	// WALPrefix is the prefix of ModeWAL's messages; the relay must read
	// the same. Defaults to [DefaultWALPrefix].
	WALPrefix string
	// MaxEventBytes is the largest event the writer accepts: its payload,
	// as the forwarder will publish it, plus the keys and values of its
	// metadata (the envelope, correlation id, traceparent). A larger event
	// fails with [ErrEventTooLarge] before anything is written. Defaults
	// to [DefaultMaxEventBytes], or to Broker's limit when that is smaller;
	// negative: no limit of the writer's own (Broker's still applies).
	// NewWriter refuses a value above Broker's limit.
	MaxEventBytes int
	// Broker is the broker the forwarder (or the WAL relay) publishes to,
	// a [brokers.Backend]'s Broker(): when it is a
	// [forwarder.PayloadLimiter] (nats, kafka, a Tee of them), its limit
	// on one message is the ceiling, and every event must fit it as the
	// broker counts a message (headers, key and framing). Nil: only
	// MaxEventBytes applies.
	//
	// [brokers.Backend]: https://pkg.go.dev/github.com/outflow-dev/outflow/brokers#Backend
	Broker forwarder.Broker
	// ClaimCheck sends payloads of at least ClaimCheck.Threshold bytes by
	// reference: stored once in the transaction, the event carrying only
	// their reference (package claimcheck). Off by default. The limits
	// above then apply to the event as it travels, reference included.
	ClaimCheck ClaimCheck
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Writer publishes events into the outbox within the caller's transaction.
// It is safe for concurrent use; one Writer serves the whole process.
type Writer struct {
	adapter   SchemaAdapter
	routes    Routes
	logger    watermill.LoggerAdapter
	mode      Mode
	walPrefix string
	// maxEventBytes is Config.MaxEventBytes with its default; 0: none.
	maxEventBytes int
	// broker is Config.Broker's limit, nil when it has none.
	broker forwarder.PayloadLimiter
	// claimCheck is Config.ClaimCheck with its defaults.
	claimCheck ClaimCheck
}

// NewWriter validates cfg and returns a Writer.
func NewWriter(cfg Config) (*Writer, error) {
	// The broker's limit is read once: a broker's can change under it (a
	// RabbitMQ reconnect, a NATS server with another max_payload), and a
	// default taken from one read must not fail validation on the next.
	lim, _ := cfg.Broker.(forwarder.PayloadLimiter)
	ceiling := 0
	if lim != nil {
		ceiling = lim.MaxMessageBytes()
	}
	cfg.setDefaults(ceiling)
	if err := cfg.validate(ceiling); err != nil {
		return nil, err
	}
	return &Writer{
		adapter:       SchemaAdapter{},
		routes:        cfg.Routes,
		logger:        watermill.NewSlogLogger(cfg.Logger),
		mode:          cfg.Mode,
		walPrefix:     cfg.WALPrefix,
		maxEventBytes: cfg.MaxEventBytes,
		broker:        lim,
		claimCheck:    cfg.ClaimCheck,
	}, nil
}

// setDefaults and validate take ceiling, Broker's limit on one message (0
// when it has none).
func (c *Config) setDefaults(ceiling int) {
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.WALPrefix = cmp.Or(c.WALPrefix, DefaultWALPrefix)
	switch {
	case c.MaxEventBytes == 0 && ceiling > 0:
		c.MaxEventBytes = min(DefaultMaxEventBytes, ceiling)
	case c.MaxEventBytes == 0:
		c.MaxEventBytes = DefaultMaxEventBytes
	case c.MaxEventBytes < 0:
		c.MaxEventBytes = 0 // none of the writer's own
	}
	c.ClaimCheck.setDefaults()
}

func (c *Config) validate(ceiling int) error {
	var errs configcheck.Errors
	if err := c.Routes.validate(); err != nil {
		errs = append(errs, fmt.Errorf("Routes: %w", err))
	}
	errs.Check(c.Mode == ModeTable || c.Mode == ModeWAL, "Mode", fmt.Sprintf("unknown %s", c.Mode))
	errs.Check(walPrefixRE.MatchString(c.WALPrefix), "WALPrefix", fmt.Sprintf("%q: 1 to 64 letters, digits or _ . : -", c.WALPrefix))
	errs.Check(ceiling == 0 || c.MaxEventBytes <= ceiling, "MaxEventBytes",
		fmt.Sprintf("%d is above the broker's limit of %d bytes per message: lower it (or leave it 0 for the broker's)", c.MaxEventBytes, ceiling))
	c.ClaimCheck.validate(&errs, cmp.Or(c.MaxEventBytes, ceiling))
	return errs.Err("outbox config")
}

// PublishTx writes evs into the outbox inside tx, in order. Nothing is
// visible to the forwarder until tx commits, and nothing remains if it rolls
// back. In [ModeWAL] it emits one transactional logical decoding message
// holding evs instead of inserting rows, with the same guarantees: the relay
// sees it only once tx commits, and a rollback leaves nothing.
func (w *Writer) PublishTx(ctx context.Context, tx pgx.Tx, evs ...events.Event) error {
	if tx == nil {
		return ErrNoTransaction
	}
	if w.mode == ModeWAL {
		return w.emitPgx(ctx, tx, evs)
	}
	return w.publish(ctx, wmsql.TxFromPgx(tx), evs)
}

// WriteTx writes the event of one change in tx: it builds it with
// events.New (a fresh message id, the time, the correlation id and
// traceparent from ctx) for agg, the aggregate at its version after the
// change, and p, and publishes it as PublishTx does, in either Mode. The
// one call a command makes for its event; PublishTx writes several, or an
// event built beforehand.
func (w *Writer) WriteTx(ctx context.Context, tx pgx.Tx, agg events.Aggregate, p events.Payload) error {
	if tx == nil {
		return ErrNoTransaction
	}
	ev, err := newEvent(ctx, agg, p)
	if err != nil {
		return err
	}
	return w.PublishTx(ctx, tx, ev)
}

// WriteStdTx is WriteTx for a database/sql transaction, as PublishStdTx.
func (w *Writer) WriteStdTx(ctx context.Context, tx *stdsql.Tx, agg events.Aggregate, p events.Payload) error {
	if tx == nil {
		return ErrNoTransaction
	}
	ev, err := newEvent(ctx, agg, p)
	if err != nil {
		return err
	}
	return w.PublishStdTx(ctx, tx, ev)
}

// newEvent is events.New, with a nil payload an error (events.New would
// panic on it).
func newEvent(ctx context.Context, agg events.Aggregate, p events.Payload) (events.Event, error) {
	if p == nil {
		return events.Event{}, fmt.Errorf("outbox: %w", &events.EnvelopeError{Field: "payload", Reason: "missing"})
	}
	ev, err := events.New(ctx, agg, p)
	if err != nil {
		return events.Event{}, fmt.Errorf("outbox: %w", err)
	}
	return ev, nil
}

// QueueTx queues the INSERT of evs onto b, a batch the caller then sends
// with tx.SendBatch, so that the outbox write costs no round trip of its
// own: it travels with the command's other writes. Errors of the INSERT
// (including a row count other than len(evs)) come back from the batch's
// Close, before the caller commits.
//
// The batch must be sent on tx: sent anywhere else it would not share the
// business transaction. A nil tx or batch is [ErrNoTransaction].
func (w *Writer) QueueTx(ctx context.Context, tx pgx.Tx, b *pgx.Batch, evs ...events.Event) error {
	if tx == nil || b == nil {
		return ErrNoTransaction
	}
	if w.mode == ModeWAL {
		return w.emitBatch(ctx, b, evs)
	}
	return w.publish(ctx, batchExecutor{b: b}, evs)
}

// PublishStdTx is PublishTx for a database/sql transaction (lib/pq, or pgx
// through its stdlib driver).
func (w *Writer) PublishStdTx(ctx context.Context, tx *stdsql.Tx, evs ...events.Event) error {
	if tx == nil {
		return ErrNoTransaction
	}
	if w.mode == ModeWAL {
		return w.emitStd(ctx, tx, evs)
	}
	return w.publish(ctx, wmsql.TxFromStdSQL(tx), evs)
}

func (w *Writer) publish(ctx context.Context, tx wmsql.ContextExecutor, evs []events.Event) error {
	if len(evs) == 0 {
		return nil
	}
	pub, err := wmsql.NewPublisher(tx, wmsql.PublisherConfig{SchemaAdapter: w.adapter}, w.logger)
	if err != nil {
		return fmt.Errorf("outbox publisher: %w", err)
	}
	// Every event is routed, encoded and measured before the first INSERT:
	// an unroutable or too large one leaves the transaction as it was.
	topics := make([]string, len(evs))
	msgs := make(message.Messages, len(evs))
	var bodies []claimcheck.Body
	for i, ev := range evs {
		if topics[i], err = w.routes.Topic(ev.Envelope); err != nil {
			return err
		}
		if msgs[i], err = ev.Message(ctx); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		var body *claimcheck.Body
		if msgs[i], body, err = w.byReference(ev, msgs[i]); err != nil {
			return err
		}
		if body != nil {
			bodies = append(bodies, *body)
		}
		if err := w.checkSize(ev, msgs[i], topics[i]); err != nil {
			return err
		}
	}
	if err := w.putBodies(ctx, wmExecer{tx}, bodies); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, stdsql.ErrTxDone) {
			return fmt.Errorf("%w: transaction already committed or rolled back", ErrNoTransaction)
		}
		return fmt.Errorf("outbox: %w", err)
	}
	// One INSERT per run of consecutive events with the same topic keeps the
	// caller's order and, in the common case of one topic, one round trip.
	for start := 0; start < len(evs); {
		topic := topics[start]
		end := start + 1
		for end < len(evs) && topics[end] == topic {
			end++
		}
		if err := pub.Publish(topic, msgs[start:end]...); err != nil {
			if errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, stdsql.ErrTxDone) {
				return fmt.Errorf("%w: transaction already committed or rolled back", ErrNoTransaction)
			}
			return fmt.Errorf("write outbox rows: %w", err)
		}
		start = end
	}
	return nil
}
