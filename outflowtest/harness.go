package outflowtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/idempotency"
)

// Outcome is what a delivery did.
type Outcome string

// The outcomes of a delivery.
const (
	// Applied: the message's transaction committed, with the handler's
	// effects (a type the handler does not list commits with none: its
	// version still counts; so does a discard marker, for which the
	// handler is never run).
	Applied Outcome = "applied"
	// Duplicate: this consumer had already processed the message id;
	// nothing ran.
	Duplicate Outcome = "duplicate"
	// Stale: the aggregate is already past this version; nothing ran.
	Stale Outcome = "stale"
	// Held: the message waits in dead_letters, status held, for an
	// earlier version of its aggregate (or behind a dead letter of it); it
	// applies once that one does.
	Held Outcome = "held"
	// Failed: the handler failed (returned an error or panicked); its
	// effects rolled back and the message was dead-lettered for a retry.
	Failed Outcome = "failed"
	// Nacked: the middleware returned an error: the broker would deliver
	// the message again.
	Nacked Outcome = "nacked"
)

// Delivery is the result of one delivery through a [HandlerHarness].
type Delivery struct {
	Outcome Outcome
	// Err is the handler's (or the middleware's) error, for Failed and
	// Nacked.
	Err error
	// Calls is how many times the handler's Func ran for this delivery,
	// retries of earlier messages it released included.
	Calls int
	// Released lists, in the order they applied, the message ids of
	// held messages that applied after this one: the later versions
	// that were waiting for it.
	Released []string
}

// HarnessOption configures a [HandlerHarness].
type HarnessOption func(*harnessConfig)

type harnessConfig struct {
	idem idempotency.Config
}

// WithIdempotency sets the idempotency configuration the harness runs the
// handler with (Pool, Consumer and Ordering are the harness's and the
// handler's); by default the package's defaults, as a Worker would.
func WithIdempotency(cfg idempotency.Config) HarnessOption {
	return func(c *harnessConfig) { c.idem = cfg }
}

// HandlerHarness runs one consumer.Handler through the real idempotency
// middleware, synchronously, against the schema pool points at: each
// delivery opens the transaction, records the message, checks its
// aggregate version, runs the handler and commits, as a Worker does, with
// no broker. Build the events with events.New (or take them from the
// outbox with [Written.Event]).
type HandlerHarness struct {
	t        testing.TB
	pool     *pgxpool.Pool
	reg      *events.Registry
	handler  consumer.Handler
	consumer *idempotency.Consumer
	fn       message.HandlerFunc

	mu      sync.Mutex
	invoked int // the middleware ran the handler (the message applied)
	calls   int // Func ran
	crashes int // the next Func calls that return nil panic after it
	// taken is the message ids this harness delivered that the consumer
	// took (anything but Nacked): the consumer keeps no row per message,
	// so a redelivery of an older one tells Duplicate from Stale here.
	taken map[string]bool
}

// NewHandlerHarness builds a harness for h on pool's schema, which must be
// migrated (see [NewSchema]) and hold the tables the handler writes.
func NewHandlerHarness(t testing.TB, pool *pgxpool.Pool, reg *events.Registry, h consumer.Handler, opts ...HarnessOption) *HandlerHarness {
	t.Helper()
	var hc harnessConfig
	for _, o := range opts {
		o(&hc)
	}
	if h.Name == "" || h.Func == nil {
		t.Fatalf("outflowtest: the handler needs a Name and a Func")
	}
	// As Worker.Add: a listed type the registry does not know would leave
	// every delivery of it unseen.
	if err := h.CheckTypes(reg); err != nil {
		t.Fatalf("outflowtest: %v", err)
	}
	icfg := hc.idem
	icfg.Pool, icfg.Consumer, icfg.Ordering = pool, h.Name, h.Ordering
	if !h.BaselineBefore.IsZero() {
		icfg.BaselineBefore = h.BaselineBefore
	}
	if icfg.Logger == nil {
		icfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	c, err := idempotency.NewConsumer(icfg)
	if err != nil {
		t.Fatalf("outflowtest: %v", err)
	}
	hh := &HandlerHarness{t: t, pool: pool, reg: reg, handler: h, consumer: c}
	// As a Worker: the router's recoverer outside, the idempotency
	// middleware, then the decoding handler.
	hh.fn = middleware.Recoverer(c.Middleware(hh.handlerFunc()))
	return hh
}

// handlerFunc is what consumer.Worker runs inside the middleware: types
// the handler does not list pass unseen; the others are decoded and handed
// to Func with the middleware's transaction.
func (h *HandlerHarness) handlerFunc() message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		h.mu.Lock()
		h.invoked++
		h.mu.Unlock()
		if !h.handler.Wants(msg.Metadata.Get(events.EventTypeKey)) {
			return nil, nil
		}
		tx, ok := idempotency.Tx(msg.Context())
		if !ok {
			return nil, errors.New("outflowtest: no transaction in the message context")
		}
		// A body by reference is fetched in the handler's transaction, as
		// a consumer.Worker does by default.
		dm, err := claimcheck.ResolveTx(msg.Context(), tx, msg)
		if err != nil {
			return nil, err
		}
		ev, err := h.reg.DecodeMessage(dm)
		if err != nil {
			return nil, err
		}
		h.mu.Lock()
		h.calls++
		h.mu.Unlock()
		if err := h.handler.Func(msg.Context(), tx, ev); err != nil {
			return nil, err
		}
		h.mu.Lock()
		crash := h.crashes > 0
		if crash {
			h.crashes--
		}
		h.mu.Unlock()
		if crash {
			panic(fmt.Sprintf("outflowtest: crash injected after handler %q returned (message %s)", h.handler.Name, ev.MessageID))
		}
		return nil, nil
	}
}

// Consumer returns the idempotency consumer the harness runs.
func (h *HandlerHarness) Consumer() *idempotency.Consumer { return h.consumer }

// Deliver hands ev to the handler as the broker would, waits until the
// message is settled and reports what happened. When it applied, the
// held messages it released (later versions that arrived first) are
// applied too, in order, before Deliver returns, as the consumer's retry
// loop would. A database error of the harness itself fails t.
func (h *HandlerHarness) Deliver(ctx context.Context, ev events.Event) Delivery {
	h.t.Helper()
	msg, err := ev.Message(ctx)
	if err != nil {
		h.t.Fatalf("outflowtest: encode %s: %v", ev.EventType, err)
	}
	return h.DeliverMessage(ctx, msg)
}

// Redeliver delivers ev again, with the same message id: what a broker
// does after a lost acknowledgement, or a forwarder that published and
// died before marking the row. The handler must not run twice: the
// Delivery's Outcome is Duplicate.
func (h *HandlerHarness) Redeliver(ctx context.Context, ev events.Event) Delivery {
	h.t.Helper()
	return h.Deliver(ctx, ev)
}

// DeliverCrashing delivers ev and crashes the handler just after its Func
// returned, before the commit: a process dying mid-message. The
// transaction rolls back with everything Func wrote in it; what Func did
// outside it stays. The Delivery says what the middleware made of the
// crash (Failed: dead-lettered for a retry, see [HandlerHarness.Retry]; or
// Nacked: the broker redelivers, see Redeliver).
func (h *HandlerHarness) DeliverCrashing(ctx context.Context, ev events.Event) Delivery {
	h.t.Helper()
	h.mu.Lock()
	h.crashes++
	h.mu.Unlock()
	d := h.Deliver(ctx, ev)
	h.mu.Lock()
	h.crashes = 0 // a crash that did not fire (a duplicate) must not hit the next delivery
	h.mu.Unlock()
	return d
}

// DeliverMessage is Deliver for a Watermill message (e.g.
// [Written.Message]).
func (h *HandlerHarness) DeliverMessage(ctx context.Context, msg *message.Message) Delivery {
	h.t.Helper()
	env, err := events.EnvelopeFromMessage(msg)
	if err != nil {
		h.t.Fatalf("outflowtest: message %s: %v", msg.UUID, err)
	}
	seen, err := h.processed(ctx, env)
	if err != nil {
		h.t.Fatalf("outflowtest: %v", err)
	}
	openBefore, err := h.openDeadLetters(ctx)
	if err != nil {
		h.t.Fatalf("outflowtest: %v", err)
	}
	var lastID int64
	if err := h.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM dead_letters`).Scan(&lastID); err != nil {
		h.t.Fatalf("outflowtest: read dead_letters: %v", err)
	}
	// The middleware applies a discard marker without running the handler:
	// that it applied shows in its aggregate's version, which it moves.
	marker := events.IsDiscardMarker(msg)
	var versionBefore int64
	if marker {
		if versionBefore, err = h.aggregateVersion(ctx, env); err != nil {
			h.t.Fatalf("outflowtest: %v", err)
		}
	}
	h.mu.Lock()
	callsBefore, invokedBefore := h.calls, h.invoked
	h.mu.Unlock()

	msg.SetContext(ctx)
	_, herr := h.fn(msg)
	h.mu.Lock()
	applied := h.invoked > invokedBefore
	h.mu.Unlock()
	if marker && herr == nil && !seen && versionBefore < env.AggregateVersion {
		after, err := h.aggregateVersion(ctx, env)
		if err != nil {
			h.t.Fatalf("outflowtest: %v", err)
		}
		applied = after >= env.AggregateVersion // the events held behind it may have applied with it
	}

	var d Delivery
	dl, err := h.deadLetter(ctx, env.MessageID)
	if err != nil {
		h.t.Fatalf("outflowtest: %v", err)
	}
	switch {
	case herr != nil:
		d.Outcome, d.Err = Nacked, herr
	case dl != nil && dl.ID > lastID && dl.Status == "held":
		d.Outcome = Held
	case dl != nil && dl.ID > lastID:
		d.Outcome, d.Err = Failed, errors.New(dl.Error)
	case applied:
		d.Outcome = Applied
	case seen:
		d.Outcome = Duplicate
	default:
		d.Outcome = Stale
	}
	if d.Outcome == Applied {
		d.Released = h.release(ctx, openBefore)
	}
	h.mu.Lock()
	if d.Outcome != Nacked {
		if h.taken == nil {
			h.taken = make(map[string]bool)
		}
		h.taken[env.MessageID] = true
	}
	d.Calls = h.calls - callsBefore
	h.mu.Unlock()
	return d
}

// Retry makes every dead letter that waits for its backoff due now and
// runs the consumer's retries until nothing more applies, as the retry
// loop would once the backoff passed. It returns the message ids that
// applied, in order.
func (h *HandlerHarness) Retry(ctx context.Context) []string {
	h.t.Helper()
	open, err := h.openDeadLetters(ctx)
	if err != nil {
		h.t.Fatalf("outflowtest: %v", err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = now()
		WHERE consumer = $1 AND status = 'retrying'`, h.handler.Name); err != nil {
		h.t.Fatalf("outflowtest: make retries due: %v", err)
	}
	return h.release(ctx, open)
}

// release runs retry rounds until one settles nothing and returns the
// message ids of the rows of candidates it resolved, in order.
func (h *HandlerHarness) release(ctx context.Context, candidates []int64) []string {
	h.t.Helper()
	var out []string
	done := map[int64]bool{}
	// What the delivery itself released (the held events right behind a
	// message apply in its transaction), then what each retry round does.
	collect := func() {
		rows, err := h.pool.Query(ctx, `SELECT id, message_id::text FROM dead_letters
			WHERE consumer = $1 AND status = 'resolved' AND id = ANY($2) ORDER BY aggregate_version, id`,
			h.handler.Name, candidates)
		if err != nil {
			h.t.Fatalf("outflowtest: %v", err)
		}
		type idMsg struct {
			ID  int64
			Msg string
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[idMsg])
		if err != nil {
			h.t.Fatalf("outflowtest: %v", err)
		}
		for _, r := range got {
			if !done[r.ID] {
				done[r.ID] = true
				out = append(out, r.Msg)
			}
		}
	}
	for {
		collect()
		n, err := h.consumer.RetryRound(ctx)
		if err != nil {
			h.t.Fatalf("outflowtest: retry dead letters: %v", err)
		}
		if n == 0 {
			return out
		}
	}
}

// RequireIdempotent proves the handler keeps its effects once under
// at-least-once delivery, for ev not delivered before. effects reads what
// the handler changes (rows of its tables, say), as any value comparable
// with reflect.DeepEqual. In order, it:
//
//  1. delivers ev with a crash after Func returned: nothing Func did may
//     remain (effects as before), or it wrote outside its transaction;
//  2. lets the message come back (retry or redelivery): it must apply;
//  3. delivers it again: a duplicate, effects unchanged.
//
// It returns the effects after the message applied.
func (h *HandlerHarness) RequireIdempotent(ctx context.Context, ev events.Event, effects func(context.Context) any) any {
	h.t.Helper()
	return h.requireIdempotent(ctx, h.t, ev, effects)
}

func (h *HandlerHarness) requireIdempotent(ctx context.Context, t testingT, ev events.Event, effects func(context.Context) any) any {
	t.Helper()
	before := effects(ctx)
	d := h.DeliverCrashing(ctx, ev)
	if d.Calls == 0 {
		t.Errorf("outflowtest: RequireIdempotent: the handler did not run for %s %s (outcome %s): deliver a new event the handler lists",
			ev.EventType, ev.MessageID, d.Outcome)
		t.FailNow()
	}
	if d.Outcome != Failed && d.Outcome != Nacked {
		t.Errorf("outflowtest: crashing delivery of %s: outcome %s, want failed or nacked", ev.MessageID, d.Outcome)
		t.FailNow()
	}
	if after := effects(ctx); !reflect.DeepEqual(before, after) {
		t.Errorf("outflowtest: handler %q changed effects in a delivery whose transaction rolled back (crash after its Func returned): it writes outside the transaction it was given, so a redelivery repeats them\nbefore: %#v\nafter:  %#v",
			h.handler.Name, before, after)
		t.FailNow()
	}
	switch d.Outcome {
	case Failed:
		released := h.Retry(ctx)
		if !slices.Contains(released, ev.MessageID) {
			t.Errorf("outflowtest: %s did not apply on its retry after the crash (released %v)", ev.MessageID, released)
			t.FailNow()
		}
	case Nacked:
		if r := h.Redeliver(ctx, ev); r.Outcome != Applied {
			t.Errorf("outflowtest: %s did not apply when redelivered after the crash: %s %v", ev.MessageID, r.Outcome, r.Err)
			t.FailNow()
		}
	}
	applied := effects(ctx)
	if r := h.Redeliver(ctx, ev); r.Outcome != Duplicate {
		t.Errorf("outflowtest: redelivery of %s: outcome %s, want duplicate", ev.MessageID, r.Outcome)
		t.FailNow()
	}
	if again := effects(ctx); !reflect.DeepEqual(applied, again) {
		t.Errorf("outflowtest: handler %q changed effects on a duplicate delivery\nbefore: %#v\nafter:  %#v", h.handler.Name, applied, again)
		t.FailNow()
	}
	return applied
}

// processed says whether the consumer already took the message: this
// harness delivered it before, or it waits in dead_letters. The consumer
// keeps no row per message (its bookkeeping is the aggregate's version),
// so another message at a version already applied reads Stale here where
// the middleware counts it a duplicate: nothing runs either way.
func (h *HandlerHarness) processed(ctx context.Context, env events.Envelope) (bool, error) {
	h.mu.Lock()
	taken := h.taken[env.MessageID]
	h.mu.Unlock()
	if taken {
		return true, nil
	}
	var seen bool
	err := h.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM dead_letters WHERE message_id = $1 AND consumer = $2
			AND status IN ('retrying', 'dead', 'held'))`, env.MessageID, h.handler.Name).Scan(&seen)
	if err != nil {
		return false, fmt.Errorf("read dead_letters: %w", err)
	}
	return seen, nil
}

// aggregateVersion is the version of env's aggregate the consumer applied
// last, 0 when none.
func (h *HandlerHarness) aggregateVersion(ctx context.Context, env events.Envelope) (int64, error) {
	var v int64
	err := h.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM consumer_aggregate_versions
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
		h.handler.Name, env.AggregateType, env.AggregateID).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("read consumer_aggregate_versions: %w", err)
	}
	return v, nil
}

func (h *HandlerHarness) openDeadLetters(ctx context.Context) ([]int64, error) {
	rows, err := h.pool.Query(ctx, `SELECT id FROM dead_letters WHERE consumer = $1 AND status IN ('held', 'retrying', 'dead')`,
		h.handler.Name)
	if err != nil {
		return nil, fmt.Errorf("read dead_letters: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read dead_letters: %w", err)
	}
	return ids, nil
}

type deadLetter struct {
	ID     int64
	Status string
	Error  string
}

func (h *HandlerHarness) deadLetter(ctx context.Context, messageID string) (*deadLetter, error) {
	var d deadLetter
	err := h.pool.QueryRow(ctx, `SELECT id, status, error FROM dead_letters WHERE consumer = $1 AND message_id = $2`,
		h.handler.Name, messageID).Scan(&d.ID, &d.Status, &d.Error)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read dead_letters: %w", err)
	}
	return &d, nil
}
