package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Registry maps event types to the Go types of their payloads. It is safe
// for concurrent use; register everything at start-up.
type Registry struct {
	mu    sync.RWMutex
	types map[string]reflect.Type
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{types: make(map[string]reflect.Type)}
}

// Register adds the payload types of ps, given as zero values of struct types
// (not pointers). Registering a second Go type under an event type already
// taken is an error; registering the same type again is not.
func (r *Registry) Register(ps ...Payload) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range ps {
		t := reflect.TypeOf(p)
		if t == nil || t.Kind() != reflect.Struct {
			return fmt.Errorf("register event: %T must be a struct value", p)
		}
		name := p.EventType()
		if name == "" {
			return fmt.Errorf("register event: %T has an empty event type", p)
		}
		if prev, ok := r.types[name]; ok && prev != t {
			return fmt.Errorf("register event: %q is already registered to %s", name, prev)
		}
		r.types[name] = t
	}
	return nil
}

// GoType returns the Go type registered for eventType, and false when
// none is: what a consumer checks its handlers' event types against at
// start-up, instead of finding a typo when no event ever reaches them.
func (r *Registry) GoType(eventType string) (reflect.Type, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.types[eventType]
	return t, ok
}

// Types lists the registered event types, sorted: for an error that names
// what a mistyped one could have been.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.types))
}

// Validator is implemented by payloads that check themselves after decoding.
type Validator interface {
	Validate() error
}

// Decode turns a JSON payload of eventType into its registered Go type.
func (r *Registry) Decode(eventType string, data []byte) (Payload, error) {
	r.mu.RLock()
	t, ok := r.types[eventType]
	r.mu.RUnlock()
	if !ok {
		return nil, &UnknownTypeError{EventType: eventType}
	}
	ptr := reflect.New(t)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(ptr.Interface()); err != nil {
		return nil, &MalformedPayloadError{EventType: eventType, Err: err}
	}
	// Not dec.More: it is false before a stray '}' or ']', which would let
	// `{...}]` through while another reader refuses it.
	if len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
		return nil, &MalformedPayloadError{EventType: eventType, Err: fmt.Errorf("trailing data after JSON value")}
	}
	p := ptr.Elem().Interface().(Payload)
	if v, ok := p.(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, &MalformedPayloadError{EventType: eventType, Err: err}
		}
	}
	return p, nil
}

// DecodeMessage reads the envelope and the typed payload of msg.
func (r *Registry) DecodeMessage(msg *message.Message) (Event, error) {
	env, err := EnvelopeFromMessage(msg)
	if err != nil {
		return Event{}, err
	}
	p, err := r.Decode(env.EventType, msg.Payload)
	if err != nil {
		return Event{}, err
	}
	return Event{Envelope: env, Payload: p}, nil
}
