package outflowtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/forwarder"
)

// Querier reads the outbox: a pgx.Tx (the transaction under test, before
// it commits, sees its own rows), a *pgxpool.Pool or a *pgx.Conn (committed
// rows).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Want describes an event expected in the outbox. Every field set must
// match; a zero field matches anything.
type Want struct {
	// Type is the event type, e.g. "payout.requested".
	Type string
	// AggregateType and AggregateID name the aggregate.
	AggregateType string
	AggregateID   string
	// Version is the aggregate version.
	Version int64
	// Topic is the topic the writer routed the event to.
	Topic string
	// Payload is compared with the row's payload as JSON, as a subset: a
	// map names just the fields it cares about (nested objects too); a
	// struct is compared as it marshals, so every field it marshals must
	// match (tag optional fields omitempty, or use a map, to leave them
	// out). Arrays must match whole. Nil matches any payload.
	Payload any
}

func (w Want) String() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("type", w.Type)
	add("aggregate", strings.Trim(w.AggregateType+"/"+w.AggregateID, "/"))
	if w.Version != 0 {
		add("version", fmt.Sprint(w.Version))
	}
	add("topic", w.Topic)
	if w.Payload != nil {
		b, err := json.Marshal(w.Payload)
		if err != nil {
			b = []byte(fmt.Sprintf("%v", w.Payload))
		}
		parts = append(parts, "payload⊇"+string(b))
	}
	if len(parts) == 0 {
		return "{any event}"
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// Written is an event as the outbox holds it.
type Written struct {
	// ID is the row's id: outbox order.
	ID               int64
	MessageID        string
	Topic            string
	EventType        string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	// Payload is the event's JSON: for an event whose body travels by
	// reference (events/outbox Config.ClaimCheck), the body, read from
	// outflow_claim_bodies, as a consumer gets it once resolved.
	Payload json.RawMessage
	// ByReference says that the body travels by reference: the row holds
	// claimcheck.Placeholder and the reference (its metadata keys are left
	// out of Metadata, as Message leaves them out of the message, which is
	// the one a consumer decodes once it has fetched the body).
	ByReference bool
	// Metadata holds the envelope fields without a column of their own
	// (correlation id, traceparent).
	Metadata   map[string]string
	OccurredAt time.Time
	// Published says whether the forwarder has handed the row to the
	// broker.
	Published bool
	// DiscardedAt is set when an operator discarded the row
	// (forwarder.DiscardParked): what the forwarder sends for it is its
	// discard marker, not this event (see [Written.Message]).
	DiscardedAt *time.Time
}

func (w Written) String() string {
	s := fmt.Sprintf("%s %s/%s v%d topic=%s %s", w.EventType, w.AggregateType, w.AggregateID,
		w.AggregateVersion, w.Topic, w.Payload)
	if w.DiscardedAt != nil {
		s += " (discarded)"
	}
	return s
}

// Message rebuilds the Watermill message the forwarder sends for the row,
// with the forwarder's own builder (forwarder.Message): the message id as
// UUID, the envelope in metadata, the payload as is; for a discarded row,
// its discard marker (events.IsDiscardMarker), which a consumer built on
// package idempotency records without running its handler. It is built
// from the fields, so a test may change them first.
func (w Written) Message(ctx context.Context) *message.Message {
	var md string
	if len(w.Metadata) > 0 {
		b, err := json.Marshal(w.Metadata)
		if err != nil {
			panic(fmt.Sprintf("outflowtest: marshal the metadata of %s: %v", w.MessageID, err)) // a map of strings always marshals
		}
		md = string(b)
	}
	msg, err := forwarder.Message(forwarder.Row{MessageID: w.MessageID, AggregateType: w.AggregateType,
		AggregateID: w.AggregateID, AggregateVersion: w.AggregateVersion, EventType: w.EventType,
		Payload: string(w.Payload), Metadata: md, OccurredAt: w.OccurredAt, DiscardedAt: w.DiscardedAt})
	if err != nil {
		// Its only error is metadata that is not an object of strings,
		// which a map of strings cannot be.
		panic(fmt.Sprintf("outflowtest: the message of %s: %v", w.MessageID, err))
	}
	msg.SetContext(ctx)
	return msg
}

// ErrDiscarded is returned by [Written.Event] for a discarded row: no
// consumer decodes its event, they receive its discard marker.
var ErrDiscarded = errors.New("the row was discarded: consumers receive its discard marker, not its event")

// Event decodes the row with reg, as a consumer would. For a discarded row
// it returns [ErrDiscarded]; [Written.Message] is its marker.
func (w Written) Event(reg *events.Registry) (events.Event, error) {
	if w.DiscardedAt != nil {
		return events.Event{}, fmt.Errorf("outflowtest: %s: %w", w.MessageID, ErrDiscarded)
	}
	return reg.DecodeMessage(w.Message(context.Background()))
}

// ReadOutbox returns every event db sees in the outbox, in outbox order.
func ReadOutbox(ctx context.Context, db Querier) ([]Written, error) {
	// The bodies by reference are joined when their table exists
	// (framework migration 00033).
	var bodies bool
	rows, err := db.Query(ctx, `SELECT to_regclass('outflow_claim_bodies') IS NOT NULL`)
	if err == nil {
		bodies, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	}
	if err != nil {
		return nil, fmt.Errorf("outflowtest: read outbox: %w", err)
	}
	body := `NULL::text`
	join := ``
	if bodies {
		body = `convert_from(b.body, 'UTF8')`
		join = `LEFT JOIN outflow_claim_bodies b ON b.message_id = o.message_id`
	}
	rows, err = db.Query(ctx, `
		SELECT o.id, o.message_id::text, o.topic, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version,
		       coalesce(`+body+`, o.payload::text), o.metadata::text, o.occurred_at, s.published, coalesce(s.discarded_at, o.discarded_at)
		FROM outbox o JOIN outbox_state s USING (id) `+join+` ORDER BY o.id`)
	if err != nil {
		return nil, fmt.Errorf("outflowtest: read outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Written, error) {
		var (
			w           Written
			payload, md string
		)
		if err := r.Scan(&w.ID, &w.MessageID, &w.Topic, &w.EventType, &w.AggregateType, &w.AggregateID,
			&w.AggregateVersion, &payload, &md, &w.OccurredAt, &w.Published, &w.DiscardedAt); err != nil {
			return w, err
		}
		w.Payload = json.RawMessage(payload)
		// A discarded row's metadata that does not parse is left out, as
		// its marker leaves it out: it may be why the row was discarded.
		if err := json.Unmarshal([]byte(md), &w.Metadata); err != nil {
			if w.DiscardedAt == nil {
				return w, fmt.Errorf("metadata of %s: %w", w.MessageID, err)
			}
			w.Metadata = nil
		}
		if _, ok := w.Metadata[claimcheck.RefKey]; ok {
			w.ByReference = true
			for _, k := range []string{claimcheck.RefKey, claimcheck.SHA256Key, claimcheck.SizeKey} {
				delete(w.Metadata, k)
			}
		}
		w.OccurredAt = w.OccurredAt.UTC()
		return w, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outflowtest: read outbox: %w", err)
	}
	return out, nil
}

// testingT is the part of testing.TB the assertions use, so that the
// package's own tests can watch them fail.
type testingT interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
}

// RequireEvent fails t unless db sees exactly one outbox event matching
// want, and returns it. Pass the transaction under test to check what it
// wrote before it commits. The failure lists what the outbox holds instead
// and why each event does not match.
func RequireEvent(ctx context.Context, t testing.TB, db Querier, want Want) Written {
	t.Helper()
	return requireEvent(ctx, t, db, want)
}

func requireEvent(ctx context.Context, t testingT, db Querier, want Want) Written {
	t.Helper()
	all := readOrFail(ctx, t, db)
	var found []Written
	for _, w := range all {
		if mismatch(want, w) == "" {
			found = append(found, w)
		}
	}
	switch len(found) {
	case 1:
		return found[0]
	case 0:
		t.Errorf("outflowtest: no event in the outbox matches %s;%s", want, listWhy(all, want))
	default:
		t.Errorf("outflowtest: %d events match %s, expected one (use RequireEvents for several):%s", len(found), want, list(found))
	}
	t.FailNow()
	return Written{}
}

// RequireEvents fails t unless the events db sees in the outbox match wants
// one for one, in outbox order (the order they were written), and returns
// them.
func RequireEvents(ctx context.Context, t testing.TB, db Querier, wants ...Want) []Written {
	t.Helper()
	return requireEvents(ctx, t, db, wants)
}

func requireEvents(ctx context.Context, t testingT, db Querier, wants []Want) []Written {
	t.Helper()
	all := readOrFail(ctx, t, db)
	var problems []string
	for i := range max(len(all), len(wants)) {
		switch {
		case i >= len(all):
			problems = append(problems, fmt.Sprintf("  #%d: want %s, missing", i+1, wants[i]))
		case i >= len(wants):
			problems = append(problems, fmt.Sprintf("  #%d: unexpected %s", i+1, all[i]))
		default:
			if why := mismatch(wants[i], all[i]); why != "" {
				problems = append(problems, fmt.Sprintf("  #%d: want %s, got %s: %s", i+1, wants[i], all[i], why))
			}
		}
	}
	if len(problems) > 0 {
		t.Errorf("outflowtest: the outbox does not hold the %d events expected, in order:\n%s\nit holds:%s",
			len(wants), strings.Join(problems, "\n"), list(all))
		t.FailNow()
	}
	return all
}

// RequireNoEvent fails t if db sees an outbox event matching want; a zero
// Want matches any event, so RequireNoEvent(ctx, t, tx, Want{}) checks that
// nothing was written.
func RequireNoEvent(ctx context.Context, t testing.TB, db Querier, want Want) {
	t.Helper()
	requireNoEvent(ctx, t, db, want)
}

func requireNoEvent(ctx context.Context, t testingT, db Querier, want Want) {
	t.Helper()
	all := readOrFail(ctx, t, db)
	var found []Written
	for _, w := range all {
		if mismatch(want, w) == "" {
			found = append(found, w)
		}
	}
	if len(found) > 0 {
		t.Errorf("outflowtest: expected no event matching %s, found %d:%s", want, len(found), list(found))
		t.FailNow()
	}
}

func readOrFail(ctx context.Context, t testingT, db Querier) []Written {
	t.Helper()
	all, err := ReadOutbox(ctx, db)
	if err != nil {
		t.Errorf("%v", err)
		t.FailNow()
	}
	return all
}

func list(ws []Written) string {
	if len(ws) == 0 {
		return " nothing"
	}
	var b strings.Builder
	for i, w := range ws {
		fmt.Fprintf(&b, "\n  %d. %s", i+1, w)
	}
	return b.String()
}

func listWhy(ws []Written, want Want) string {
	if len(ws) == 0 {
		return " the outbox is empty"
	}
	var b strings.Builder
	fmt.Fprintf(&b, " it holds %d event(s):", len(ws))
	for i, w := range ws {
		fmt.Fprintf(&b, "\n  %d. %s (%s)", i+1, w, mismatch(want, w))
	}
	return b.String()
}

// mismatch says why w does not match want, or "" when it does.
func mismatch(want Want, w Written) string {
	var why []string
	if want.Type != "" && want.Type != w.EventType {
		why = append(why, fmt.Sprintf("type %q", w.EventType))
	}
	if want.AggregateType != "" && want.AggregateType != w.AggregateType {
		why = append(why, fmt.Sprintf("aggregate type %q", w.AggregateType))
	}
	if want.AggregateID != "" && want.AggregateID != w.AggregateID {
		why = append(why, fmt.Sprintf("aggregate id %q", w.AggregateID))
	}
	if want.Version != 0 && want.Version != w.AggregateVersion {
		why = append(why, fmt.Sprintf("version %d", w.AggregateVersion))
	}
	if want.Topic != "" && want.Topic != w.Topic {
		why = append(why, fmt.Sprintf("topic %q", w.Topic))
	}
	if want.Payload != nil {
		if d := payloadMismatch(want.Payload, w.Payload); d != "" {
			why = append(why, "payload "+d)
		}
	}
	return strings.Join(why, ", ")
}

// payloadMismatch compares want, marshalled, with got as a JSON subset.
func payloadMismatch(want any, got json.RawMessage) string {
	wb, err := json.Marshal(want)
	if err != nil {
		return fmt.Sprintf("cannot marshal the wanted payload: %v", err)
	}
	var wv, gv any
	if err := decodeJSON(wb, &wv); err != nil {
		return fmt.Sprintf("wanted payload: %v", err)
	}
	if err := decodeJSON(got, &gv); err != nil {
		return fmt.Sprintf("not JSON: %v", err)
	}
	return subset("", wv, gv)
}

func decodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // compare numbers as written, not as float64
	return dec.Decode(v)
}

// subset reports where want is not contained in got: objects by key,
// recursively; anything else whole.
func subset(path string, want, got any) string {
	wm, ok := want.(map[string]any)
	if !ok {
		if !jsonEqual(want, got) {
			return fmt.Sprintf("%s is %s, want %s", orRoot(path), compact(got), compact(want))
		}
		return ""
	}
	gm, ok := got.(map[string]any)
	if !ok {
		return fmt.Sprintf("%s is %s, want an object", orRoot(path), compact(got))
	}
	for k, wv := range wm {
		gv, present := gm[k]
		if !present {
			return fmt.Sprintf("%s.%s is missing", path, k)
		}
		if d := subset(path+"."+k, wv, gv); d != "" {
			return d
		}
	}
	return ""
}

func jsonEqual(a, b any) bool {
	an, aok := a.(json.Number)
	bn, bok := b.(json.Number)
	if aok && bok {
		if an == bn {
			return true
		}
		// 1250 and 1250.0 are one number.
		af, aerr := an.Float64()
		bf, berr := bn.Float64()
		if aerr == nil && berr == nil {
			return af == bf
		}
	}
	return reflect.DeepEqual(a, b)
}

func orRoot(path string) string {
	if path == "" {
		return "payload"
	}
	return path[1:]
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
