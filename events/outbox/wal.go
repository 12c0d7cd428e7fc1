package outbox

import (
	"context"
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
)

// Mode chooses how a [Writer] records events.
type Mode int

const (
	// ModeTable writes each event as a row of the outbox table, which the
	// forwarder (package forwarder) claims and publishes. The default.
	ModeTable Mode = iota
	// ModeWAL emits the events of each call as one transactional logical
	// decoding message (pg_logical_emit_message) instead: nothing is
	// inserted, updated or vacuumed per event, and the relay (package
	// walrelay) reads the messages through a replication slot in commit
	// order. The database needs wal_level=logical. See docs/wal-mode.md.
	ModeWAL
)

func (m Mode) String() string {
	switch m {
	case ModeTable:
		return "table"
	case ModeWAL:
		return "wal"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// DefaultWALPrefix is the logical decoding message prefix of ModeWAL when
// Config.WALPrefix is empty; the relay reads the messages with this prefix.
const DefaultWALPrefix = "outflow"

// WALMessageVersion is the version of the [WALMessage] envelope the writer
// emits. A relay refuses (parks) an envelope of a version it does not know
// rather than guess its fields.
const WALMessageVersion = 1

// WALMessage is the content of one logical decoding message of ModeWAL: the
// events of one PublishTx, QueueTx or PublishStdTx call, in the caller's
// order, as JSON.
type WALMessage struct {
	V      int        `json:"v"`
	Events []WALEvent `json:"events"`
}

// WALEvent is one event of a [WALMessage]: the outbox row's columns.
type WALEvent struct {
	MessageID        string            `json:"message_id"`
	Topic            string            `json:"topic"`
	AggregateType    string            `json:"aggregate_type"`
	AggregateID      string            `json:"aggregate_id"`
	AggregateVersion int64             `json:"aggregate_version"`
	EventType        string            `json:"event_type"`
	Payload          json.RawMessage   `json:"payload"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	OccurredAt       time.Time         `json:"occurred_at"`
}

// walPrefixRE keeps the prefix printable and short: it is written into
// every message and compared by the relay.
var walPrefixRE = regexp.MustCompile(`^[A-Za-z0-9_.:\-]{1,64}$`)

const emitSQL = `SELECT pg_logical_emit_message(true, $1::text, $2::text)`

// walContent encodes evs as one WALMessage, and returns the bodies that go
// by reference.
func (w *Writer) walContent(ctx context.Context, evs []events.Event) (string, []claimcheck.Body, error) {
	m := WALMessage{V: WALMessageVersion, Events: make([]WALEvent, 0, len(evs))}
	var bodies []claimcheck.Body
	for _, ev := range evs {
		topic, err := w.routes.Topic(ev.Envelope)
		if err != nil {
			return "", nil, err
		}
		// Message validates the event and encodes its payload; the
		// envelope's fields are taken from ev itself, not parsed back.
		msg, err := ev.Message(ctx)
		if err != nil {
			return "", nil, fmt.Errorf("outbox: %w", err)
		}
		var body *claimcheck.Body
		if msg, body, err = w.byReference(ev, msg); err != nil {
			return "", nil, err
		}
		if body != nil {
			bodies = append(bodies, *body)
		}
		if err := w.checkSize(ev, msg, topic); err != nil {
			return "", nil, err
		}
		env := ev.Envelope
		var md map[string]string
		if env.CorrelationID != "" {
			md = setExtra(md, events.CorrelationIDKey, env.CorrelationID)
		}
		if env.Traceparent != "" {
			md = setExtra(md, events.TraceparentKey, env.Traceparent)
		}
		// As in table mode, where it is in the metadata column: Message set
		// it from the payload.
		if v := msg.Metadata.Get(events.SchemaVersionKey); v != "" {
			md = setExtra(md, events.SchemaVersionKey, v)
		}
		if body != nil {
			for _, k := range []string{claimcheck.RefKey, claimcheck.SHA256Key, claimcheck.SizeKey} {
				md = setExtra(md, k, msg.Metadata.Get(k))
			}
		}
		m.Events = append(m.Events, WALEvent{
			MessageID: msg.UUID, Topic: topic, AggregateType: env.AggregateType, AggregateID: env.AggregateID,
			AggregateVersion: env.AggregateVersion, EventType: env.EventType, Payload: json.RawMessage(msg.Payload),
			// Rounded to the microsecond, as a timestamptz column keeps it:
			// the relay, its history and table mode publish the same time.
			Metadata: md, OccurredAt: env.OccurredAt.Round(time.Microsecond),
		})
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", nil, fmt.Errorf("outbox: encode WAL message: %w", err)
	}
	return string(b), bodies, nil
}

// setExtra keeps k in md unless it is one of the envelope's own fields,
// which WALEvent carries as fields (as the outbox row does as columns).
func setExtra(md map[string]string, k, v string) map[string]string {
	for _, c := range columnKeys {
		if k == c {
			return md
		}
	}
	if md == nil {
		md = make(map[string]string, 2)
	}
	md[k] = v
	return md
}

// emit is the ModeWAL path of the three publish methods: exec runs or
// queues the one emit statement, and tx the INSERT of the bodies by
// reference (a row each: the table is the store, the message carries
// their references).
func (w *Writer) emit(ctx context.Context, evs []events.Event, tx claimcheck.Execer, exec func(content string) error) error {
	if len(evs) == 0 {
		return nil
	}
	content, bodies, err := w.walContent(ctx, evs)
	if err != nil {
		return err
	}
	err = w.putBodies(ctx, tx, bodies)
	if err == nil {
		err = exec(content)
	}
	if err != nil {
		if errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, stdsql.ErrTxDone) {
			return fmt.Errorf("%w: transaction already committed or rolled back", ErrNoTransaction)
		}
		return fmt.Errorf("emit outbox WAL message: %w", err)
	}
	return nil
}

func (w *Writer) emitPgx(ctx context.Context, tx pgx.Tx, evs []events.Event) error {
	return w.emit(ctx, evs, pgxExecer{tx}, func(content string) error {
		_, err := tx.Exec(ctx, emitSQL, w.walPrefix, content)
		return err
	})
}

func (w *Writer) emitBatch(ctx context.Context, b *pgx.Batch, evs []events.Event) error {
	return w.emit(ctx, evs, batchQueuer{b}, func(content string) error {
		b.Queue(emitSQL, w.walPrefix, content)
		return nil
	})
}

func (w *Writer) emitStd(ctx context.Context, tx *stdsql.Tx, evs []events.Event) error {
	return w.emit(ctx, evs, stdExecer{tx}, func(content string) error {
		_, err := tx.ExecContext(ctx, emitSQL, w.walPrefix, content)
		return err
	})
}
