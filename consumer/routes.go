package consumer

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/outflow-dev/outflow/events"
)

// ErrNotRouted is returned (wrapped, naming the handler, the topic and the
// event type) by [CheckRoutes] for a handler reading a topic the writer's
// routes send none of its events to: it would run, idle, and never be
// called.
var ErrNotRouted = errors.New("no route sends these events to the handler's topic")

// CheckRoutes reports every mismatch between the routes events are written
// with and the handlers that read them, one error per mismatch, joined:
//
//   - a listed event type reg does not know ([ErrUnknownEventType]), or a
//     typed handler's payload type that is not the registered one
//     ([ErrPayloadType]), as [Handler.CheckTypes];
//   - a listed event type routed to another topic than the handler's, or
//     to none, and a handler of every type (no EventTypes) whose topic is
//     no route's ([ErrNotRouted]).
//
// routes is the writer's outbox.Routes (event type to topic, "*" the
// fallback; pass it as is). With nil routes every event goes to the topic
// named after its aggregate type, which the writing code alone knows: only
// the event types are checked then. A service calls it at start-up, where
// it has both (its writer's routes and its handlers), and in a test;
// outflowtest.StartPipeline calls it when given WithRoutes.
func CheckRoutes(routes map[string]string, reg *events.Registry, hs ...Handler) error {
	var errs []error
	topics := slices.Sorted(maps.Values(routes))
	topics = slices.Compact(topics)
	for _, h := range hs {
		if err := h.CheckTypes(reg); err != nil {
			errs = append(errs, err)
		}
		if routes == nil {
			continue
		}
		if len(h.EventTypes) == 0 {
			if !slices.Contains(topics, h.Topic) {
				errs = append(errs, fmt.Errorf("handler %q reads topic %q: %w (routed topics: %s)",
					h.Name, h.Topic, ErrNotRouted, strings.Join(topics, ", ")))
			}
			continue
		}
		for _, typ := range h.EventTypes {
			if reg != nil {
				if _, ok := reg.GoType(typ); !ok {
					continue // reported by CheckTypes: one mistake, one error
				}
			}
			topic, ok := routes[typ]
			if !ok {
				topic, ok = routes["*"]
			}
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("handler %q reads topic %q, lists event type %q: %w (no route for the type)",
					h.Name, h.Topic, typ, ErrNotRouted))
			case topic != h.Topic:
				errs = append(errs, fmt.Errorf("handler %q reads topic %q, lists event type %q: %w (it is routed to %q)",
					h.Name, h.Topic, typ, ErrNotRouted, topic))
			}
		}
	}
	return errors.Join(errs...)
}
