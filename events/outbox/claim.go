package outbox

import (
	"context"
	stdsql "database/sql"
	"fmt"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/internal/configcheck"
)

// DefaultMaxBodyBytes is ClaimCheck.MaxBodyBytes when it is 0: 64 MiB. A
// consumer holds a body in memory, twice while it decodes it.
const DefaultMaxBodyBytes = 64 << 20

// ClaimCheck sends large payloads by reference (package claimcheck): the
// payload is stored once, in the business transaction, and the event
// carries only its reference. Off unless Threshold is set: every consumer
// of the event must be able to fetch the body (a consumer.Worker does;
// its database role must be granted outflow_claim_reader) before the
// producer sends one, so turning it on is a deployment decision, not a
// default. A consumer that does not resolve references sees
// [claimcheck.Placeholder], never a payload of zero values.
type ClaimCheck struct {
	// Threshold: a payload of at least Threshold bytes (as encoded, JSON)
	// goes by reference. 0: off.
	Threshold int
	// MaxBodyBytes is the largest payload sent by reference: a larger one
	// fails with [ErrEventTooLarge] ([EventTooLargeError.ByReference])
	// before anything is written. Defaults to [DefaultMaxBodyBytes];
	// negative: no limit.
	MaxBodyBytes int
	// Store keeps the bodies. Defaults to [claimcheck.Postgres] (table
	// outflow_claim_bodies of the outbox's database, migration 00033).
	Store claimcheck.Store
}

func (c *ClaimCheck) setDefaults() {
	switch {
	case c.MaxBodyBytes == 0:
		c.MaxBodyBytes = DefaultMaxBodyBytes
	case c.MaxBodyBytes < 0:
		c.MaxBodyBytes = 0 // no limit
	}
	if c.Store == nil {
		c.Store = claimcheck.Postgres{}
	}
}

// validate records what is wrong with c, given the writer's effective
// event limit (maxEvent, 0: none): a payload between that limit and
// Threshold would stay inline and be refused as too large, never sent by
// reference.
func (c *ClaimCheck) validate(errs *configcheck.Errors, maxEvent int) {
	errs.Check(c.Threshold >= 0, "ClaimCheck.Threshold", "must be 0 (off) or more")
	if c.Threshold <= 0 {
		return
	}
	errs.Check(c.MaxBodyBytes == 0 || c.MaxBodyBytes >= c.Threshold, "ClaimCheck.MaxBodyBytes",
		fmt.Sprintf("%d is below ClaimCheck.Threshold %d (0 means %d): no payload could go by reference; raise it or lower ClaimCheck.Threshold",
			c.MaxBodyBytes, c.Threshold, DefaultMaxBodyBytes))
	errs.Check(maxEvent == 0 || c.Threshold <= maxEvent, "ClaimCheck.Threshold",
		fmt.Sprintf("%d is above the writer's event limit of %d bytes (MaxEventBytes, or the broker's): a payload between them could be written neither inline nor by reference; lower it",
			c.Threshold, maxEvent))
}

// byReference returns msg unchanged when its payload stays inline, or
// the message that travels instead (the placeholder payload and the
// reference in its metadata) and the body to store.
func (w *Writer) byReference(ev events.Event, msg *message.Message) (*message.Message, *claimcheck.Body, error) {
	cc := w.claimCheck
	if cc.Threshold == 0 || len(msg.Payload) < cc.Threshold {
		return msg, nil, nil
	}
	if cc.MaxBodyBytes > 0 && len(msg.Payload) > cc.MaxBodyBytes {
		env := ev.Envelope
		return nil, nil, &EventTooLargeError{MessageID: env.MessageID, EventType: env.EventType, AggregateType: env.AggregateType,
			AggregateID: env.AggregateID, Size: len(msg.Payload), Limit: cc.MaxBodyBytes, ByReference: true}
	}
	ref := claimcheck.NewRef(msg.UUID, msg.Payload)
	out := message.NewMessage(msg.UUID, []byte(claimcheck.Placeholder))
	out.Metadata = make(message.Metadata, len(msg.Metadata)+3)
	for k, v := range msg.Metadata {
		out.Metadata[k] = v
	}
	ref.SetMetadata(out.Metadata)
	out.SetContext(msg.Context())
	return out, &claimcheck.Body{MessageID: msg.UUID, Ref: ref, Data: msg.Payload}, nil
}

// putBodies stores bodies in the transaction exec runs in.
func (w *Writer) putBodies(ctx context.Context, exec claimcheck.Execer, bodies []claimcheck.Body) error {
	if len(bodies) == 0 {
		return nil
	}
	return w.claimCheck.Store.Put(ctx, exec, bodies)
}

// Execers of the writer's three kinds of transaction handle.
type (
	pgxExecer   struct{ tx pgx.Tx }
	stdExecer   struct{ tx *stdsql.Tx }
	batchQueuer struct{ b *pgx.Batch }
	wmExecer    struct{ tx wmsql.ContextExecutor }
)

func (e pgxExecer) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.tx.Exec(ctx, sql, args...)
	return err
}

func (e stdExecer) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.tx.ExecContext(ctx, sql, args...)
	return err
}

// Exec queues the statement: its error comes back from the batch's Close,
// before the caller commits, as the outbox INSERT's does.
func (e batchQueuer) Exec(_ context.Context, sql string, args ...any) error {
	e.b.Queue(sql, args...).Exec(func(pgconn.CommandTag) error { return nil })
	return nil
}

func (e wmExecer) Exec(ctx context.Context, sql string, args ...any) error {
	if b, ok := e.tx.(batchExecutor); ok {
		return batchQueuer{b.b}.Exec(ctx, sql, args...)
	}
	_, err := e.tx.ExecContext(ctx, sql, args...)
	return err
}
