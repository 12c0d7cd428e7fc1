package consumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
)

// ErrUnknownEventType is returned (wrapped, naming the handler and the
// type) for a handler that lists an event type the registry does not
// know: a typo, or a payload never registered. Without the check the
// handler would run, idle, and never be called.
var ErrUnknownEventType = errors.New("event type not registered")

// ErrPayloadType is returned (wrapped) when a typed handler's payload type
// is not the Go type the registry decodes its event type into, at Add, or
// for an event whose payload is not that type, when handled.
var ErrPayloadType = errors.New("payload type does not match the registry")

// TypedFunc is the function of one event type of a handler built with
// [OnEach]. Make it with [Typed].
type TypedFunc struct {
	eventType string
	goType    reflect.Type
	fn        Func
	err       error
}

// Typed wraps fn, a function of the payload type T, for [OnEach]: the
// event type is T's (T must be the struct type registered for it), and fn
// gets the decoded payload as a T, with no type assertion to write.
func Typed[T events.Payload](fn func(ctx context.Context, tx pgx.Tx, ev events.Event, p T) error) TypedFunc {
	t := reflect.TypeFor[T]()
	switch {
	case t.Kind() != reflect.Struct:
		// The registry holds struct values only, and EventType on the zero
		// value of a pointer type would panic.
		return TypedFunc{err: fmt.Errorf("payload type %s: must be a struct type, as registered", t)}
	case fn == nil:
		return TypedFunc{err: fmt.Errorf("payload type %s: the function is nil", t)}
	}
	var zero T
	name := zero.EventType()
	if name == "" {
		return TypedFunc{err: fmt.Errorf("payload type %s: empty event type", t)}
	}
	return TypedFunc{eventType: name, goType: t, fn: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		p, ok := ev.Payload.(T)
		if !ok {
			return fmt.Errorf("event %s (%s): payload %T, want %s: %w", ev.MessageID, ev.EventType, ev.Payload, t, ErrPayloadType)
		}
		return fn(ctx, tx, ev, p)
	}}
}

// On returns the handler named name that reads topic and gets the events
// of T's type, decoded into T:
//
//	consumer.On("fulfil-orders", "orders",
//		func(ctx context.Context, tx pgx.Tx, ev events.Event, o OrderPlaced) error { ... })
//
// Its EventTypes is T's event type, which Add checks is registered as T.
// Set the other fields (Committed, Ordering, BatchSize...) on the result.
// A handler of several types is [OnEach].
func On[T events.Payload](name, topic string, fn func(ctx context.Context, tx pgx.Tx, ev events.Event, p T) error) Handler {
	return OnEach(name, topic, Typed(fn))
}

// OnEach returns the handler named name that reads topic and gets the
// events of each function's payload type, each decoded and passed to its
// own function:
//
//	consumer.OnEach("balances", "payouts",
//		consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev events.Event, p Requested) error { ... }),
//		consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev events.Event, p Sent) error { ... }),
//	)
//
// Its EventTypes are the functions' event types. A mistake in building it
// (no function, two for one type, a payload type that is not a struct) is
// returned by Add.
func OnEach(name, topic string, fns ...TypedFunc) Handler {
	h := Handler{Name: name, Topic: topic, payloads: make(map[string]reflect.Type, len(fns))}
	byType := make(map[string]Func, len(fns))
	var errs []error
	if len(fns) == 0 {
		errs = append(errs, errors.New("no function: give OnEach one per event type"))
	}
	for _, f := range fns {
		switch {
		case f.err != nil:
			errs = append(errs, f.err)
			continue
		case f.fn == nil:
			errs = append(errs, errors.New("a zero TypedFunc: make it with consumer.Typed"))
			continue
		case byType[f.eventType] != nil:
			errs = append(errs, fmt.Errorf("two functions for event type %q", f.eventType))
			continue
		}
		byType[f.eventType] = f.fn
		h.payloads[f.eventType] = f.goType
		h.EventTypes = append(h.EventTypes, f.eventType)
	}
	if len(errs) > 0 {
		h.err = errors.Join(errs...)
	}
	h.Func = func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		fn, ok := byType[ev.EventType]
		if !ok {
			// EventTypes was changed after OnEach: the worker delivered a
			// type no function takes.
			return fmt.Errorf("handler %q: no function for event type %q", name, ev.EventType)
		}
		return fn(ctx, tx, ev)
	}
	return h
}

// CheckTypes reports every event type h lists that reg does not know
// ([ErrUnknownEventType]) and, for a handler built with [On] or [OnEach],
// every payload type that is not the one reg decodes its event type into
// ([ErrPayloadType]), and the handler's construction error. Worker.Add
// runs it; outflowtest's harness and pipeline too.
func (h Handler) CheckTypes(reg *events.Registry) error {
	if h.err != nil {
		return fmt.Errorf("handler %q: %w", h.Name, h.err)
	}
	if reg == nil {
		return fmt.Errorf("handler %q: no registry to check its event types against", h.Name)
	}
	if h.payloads != nil && len(h.EventTypes) == 0 {
		// Every type would reach functions that take only theirs.
		return fmt.Errorf("handler %q: built with On or OnEach, its EventTypes was emptied", h.Name)
	}
	var errs []error
	for _, typ := range h.EventTypes {
		got, ok := reg.GoType(typ)
		if !ok {
			errs = append(errs, fmt.Errorf("handler %q lists event type %q: %w (registered: %s)",
				h.Name, typ, ErrUnknownEventType, strings.Join(reg.Types(), ", ")))
			continue
		}
		if h.payloads == nil {
			continue
		}
		want, ok := h.payloads[typ]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("handler %q lists event type %q, which none of its typed functions takes", h.Name, typ))
		case want != got:
			errs = append(errs, fmt.Errorf("handler %q takes %s for event type %q, registered as %s: %w",
				h.Name, want, typ, got, ErrPayloadType))
		}
	}
	return errors.Join(errs...)
}
