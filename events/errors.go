package events

import "fmt"

// EnvelopeError reports a missing or invalid envelope field.
type EnvelopeError struct {
	Field  string
	Reason string
}

func (e *EnvelopeError) Error() string {
	return fmt.Sprintf("event envelope: %s: %s", e.Field, e.Reason)
}

// UnknownTypeError is returned when decoding an event type that was never
// registered.
type UnknownTypeError struct {
	EventType string
}

func (e *UnknownTypeError) Error() string {
	if e.EventType == "" {
		return "decode event: no event type"
	}
	return fmt.Sprintf("decode event: unknown event type %q", e.EventType)
}

// MalformedPayloadError is returned when a payload cannot be decoded into
// its registered type, or decodes but fails the type's validation.
type MalformedPayloadError struct {
	EventType string
	// Field is the JSON field at fault when one is known: an unknown field
	// of a strict type, or the dotted path of a type mismatch.
	Field string
	Err   error
}

func (e *MalformedPayloadError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("decode event %q: malformed payload: field %q: %v", e.EventType, e.Field, e.Err)
	}
	return fmt.Sprintf("decode event %q: malformed payload: %v", e.EventType, e.Err)
}

func (e *MalformedPayloadError) Unwrap() error { return e.Err }

// ValidationError wraps what a payload type's own Validate returned: the
// payload decoded into its Go type, the type refused its values. It reads
// as the Validate error alone; a caller that judges the JSON shape only
// (package schemacheck, on payloads it generated) tells the two apart with
// errors.As.
type ValidationError struct {
	Err error
}

func (e *ValidationError) Error() string { return e.Err.Error() }

func (e *ValidationError) Unwrap() error { return e.Err }
