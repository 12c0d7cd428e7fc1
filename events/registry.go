package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Registry maps event types to the Go types of their payloads, and to the
// upcasters that bring an older payload to the Go type's schema version. It
// is safe for concurrent use; register everything at start-up.
type Registry struct {
	mu    sync.RWMutex
	types map[string]*entry
}

// entry is one registered event type.
type entry struct {
	t       reflect.Type
	version int
	strict  bool
	// up[i] turns version i+1 into i+2: len(up) == version-1.
	up []func(json.RawMessage) (json.RawMessage, error)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{types: make(map[string]*entry)}
}

// Register adds the payload types of ps, given as zero values of struct types
// (not pointers). Registering a second Go type under an event type already
// taken is an error; registering the same type again is not.
//
// A type of schema version 2 or more ([Versioned]) needs its upcasters:
// register it with [Registry.RegisterVersioned]. Register accepts it again
// afterwards (a no-op), so that a list of every type of a service can still
// be registered in one call after its versioned ones.
func (r *Registry) Register(ps ...Payload) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range ps {
		if err := r.register(p, nil); err != nil {
			return err
		}
	}
	return nil
}

// RegisterVersioned adds the payload type of p, of schema version n
// ([Versioned]), with the upcasters from every older version: exactly one
// From each of 1 to n-1, in any order. A missing one (a gap in the chain),
// a duplicate, one From outside 1..n-1 or a nil Func is an error naming the
// event type and the version, so that a chain that cannot bring every
// stored event to the Go type fails at start-up, not at the first old event.
func (r *Registry) RegisterVersioned(p Payload, ups ...Upcaster) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.register(p, ups)
}

func (r *Registry) register(p Payload, ups []Upcaster) error {
	t := reflect.TypeOf(p)
	if t == nil || t.Kind() != reflect.Struct {
		return fmt.Errorf("register event: %T must be a struct value", p)
	}
	name := p.EventType()
	if name == "" {
		return fmt.Errorf("register event: %T has an empty event type", p)
	}
	if prev, ok := r.types[name]; ok {
		if prev.t != t {
			return fmt.Errorf("register event: %q is already registered to %s", name, prev.t)
		}
		if len(ups) > 0 {
			return fmt.Errorf("register event %q: its upcasters are already registered", name)
		}
		return nil
	}
	e := &entry{t: t, version: SchemaVersionOf(p)}
	if s, ok := p.(StrictDecoder); ok {
		e.strict = s.StrictDecoding()
	}
	chain, err := upcastChain(name, e.version, ups)
	if err != nil {
		return err
	}
	e.up = chain
	r.types[name] = e
	return nil
}

// upcastChain checks ups against version and orders them by From.
func upcastChain(name string, version int, ups []Upcaster) ([]func(json.RawMessage) (json.RawMessage, error), error) {
	if version < 1 {
		return nil, fmt.Errorf("register event %q: schema version %d, must be 1 or more", name, version)
	}
	chain := make([]func(json.RawMessage) (json.RawMessage, error), version-1)
	var errs []error
	for _, u := range ups {
		switch {
		case u.From < 1 || u.From >= version:
			errs = append(errs, fmt.Errorf("register event %q: upcaster from version %d: outside 1 to %d (the type is version %d)", name, u.From, version-1, version))
		case u.Func == nil:
			errs = append(errs, fmt.Errorf("register event %q: upcaster from version %d: nil Func", name, u.From))
		case chain[u.From-1] != nil:
			errs = append(errs, fmt.Errorf("register event %q: upcaster from version %d: registered twice", name, u.From))
		default:
			chain[u.From-1] = u.Func
		}
	}
	for i, f := range chain {
		if f == nil {
			errs = append(errs, fmt.Errorf("register event %q: no upcaster from version %d to %d (see RegisterVersioned): a stored version %d payload could not be read", name, i+1, i+2, i+1))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return chain, nil
}

// GoType returns the Go type registered for eventType, and false when
// none is: what a consumer checks its handlers' event types against at
// start-up, instead of finding a typo when no event ever reaches them.
func (r *Registry) GoType(eventType string) (reflect.Type, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.types[eventType]
	if !ok {
		return nil, false
	}
	return e.t, true
}

// SchemaVersion returns the schema version of the Go type registered for
// eventType (the newest this registry decodes), and false when none is.
func (r *Registry) SchemaVersion(eventType string) (int, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.types[eventType]
	if !ok {
		return 0, false
	}
	return e.version, true
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

// Decode turns a JSON payload of eventType, at the registered Go type's
// schema version (what this build's producer encodes), into that type. For
// a payload of another version, use [Registry.DecodeVersion].
func (r *Registry) Decode(eventType string, data []byte) (Payload, error) {
	return r.DecodeVersion(eventType, 0, data)
}

// DecodeVersion turns a JSON payload of eventType written at schema version
// (0 meaning the registered type's) into the registered Go type: an older
// payload goes through the upcasters first, one version at a time. A
// version newer than the registered type's is a [*VersionError] that
// errors.Is [ErrUnknownVersion]; the payload is not decoded.
func (r *Registry) DecodeVersion(eventType string, version int, data []byte) (Payload, error) {
	e, data, err := r.upcast(eventType, version, data)
	if err != nil {
		return nil, err
	}
	ptr := reflect.New(e.t)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if e.strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(ptr.Interface()); err != nil {
		return nil, &MalformedPayloadError{EventType: eventType, Field: jsonErrorField(err), Err: err}
	}
	// Not dec.More: it is false before a stray '}' or ']', which would let
	// `{...}]` through while another reader refuses it.
	if len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
		return nil, &MalformedPayloadError{EventType: eventType, Err: fmt.Errorf("trailing data after JSON value")}
	}
	p := ptr.Elem().Interface().(Payload)
	if v, ok := p.(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, &MalformedPayloadError{EventType: eventType, Err: &ValidationError{Err: err}}
		}
	}
	return p, nil
}

// Upcast runs the upcasters of eventType on a payload written at schema
// version (0 meaning the registered type's) and returns it at the
// registered type's version, not decoded: what [Registry.DecodeVersion]
// decodes. A check of the upcasters (package schemacheck) reads it to find
// a field an upcaster left behind, which a lenient decode would ignore.
func (r *Registry) Upcast(eventType string, version int, data []byte) (json.RawMessage, error) {
	_, data, err := r.upcast(eventType, version, data)
	return data, err
}

// upcast finds eventType's entry and brings data from version (0 meaning
// the entry's) to the entry's version.
func (r *Registry) upcast(eventType string, version int, data []byte) (*entry, []byte, error) {
	r.mu.RLock()
	e, ok := r.types[eventType]
	r.mu.RUnlock()
	if !ok {
		return nil, nil, &UnknownTypeError{EventType: eventType}
	}
	if version == 0 {
		version = e.version
	}
	switch {
	case version < 1:
		return nil, nil, &VersionError{EventType: eventType, Raw: fmt.Sprint(version)}
	case version > e.version:
		return nil, nil, &VersionError{EventType: eventType, Version: version, Known: e.version}
	}
	data, err := e.upcast(eventType, version, data)
	if err != nil {
		return nil, nil, err
	}
	return e, data, nil
}

// upcast brings data from version to e's, one upcaster at a time.
func (e *entry) upcast(eventType string, version int, data []byte) ([]byte, error) {
	for v := version; v < e.version; v++ {
		// An upcaster reads what the previous one wrote: a stray value
		// after the JSON, which it may not notice, is refused first.
		if !json.Valid(data) {
			return nil, &MalformedPayloadError{EventType: eventType, Err: fmt.Errorf("version %d: not one JSON value", v)}
		}
		out, err := e.up[v-1](json.RawMessage(data))
		if err != nil {
			return nil, &MalformedPayloadError{EventType: eventType, Err: fmt.Errorf("upcast from version %d to %d: %w", v, v+1, err)}
		}
		data = out
	}
	return data, nil
}

// jsonErrorField names the field an encoding/json error is about: the
// dotted path of a type mismatch, the name of an unknown field (which
// encoding/json reports in its message only); "" for a syntax error.
func jsonErrorField(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	const unknown = "json: unknown field "
	if msg := err.Error(); strings.HasPrefix(msg, unknown) {
		if f, err := strconv.Unquote(strings.TrimPrefix(msg, unknown)); err == nil {
			return f
		}
	}
	return ""
}

// DecodeMessage reads the envelope and the typed payload of msg, upcasting
// a payload of an older schema version (metadata [SchemaVersionKey]; none
// is version 1) to the registered Go type's.
func (r *Registry) DecodeMessage(msg *message.Message) (Event, error) {
	env, err := EnvelopeFromMessage(msg)
	if err != nil {
		return Event{}, err
	}
	v, err := messageSchemaVersion(env.EventType, msg.Metadata)
	if err != nil {
		return Event{}, err
	}
	p, err := r.DecodeVersion(env.EventType, v, msg.Payload)
	if err != nil {
		return Event{}, err
	}
	return Event{Envelope: env, Payload: p}, nil
}
