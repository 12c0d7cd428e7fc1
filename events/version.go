package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// SchemaVersionKey is the metadata key of the payload's schema version (see
// [Versioned]). A message without it carries version 1: version 1 is
// written without it, as events were before versions existed, which spares
// every event of an unversioned type the key's bytes in the outbox (24 of
// its WAL; docs/benchmarks.md).
const SchemaVersionKey = "schema_version"

// Versioned is implemented by a payload type whose JSON shape has changed
// since its first version: SchemaVersion returns the version the Go type
// encodes, a constant of the type (the registry calls it on the zero
// value). A payload without it is version 1. Raising it means registering
// an [Upcaster] from the previous version (see [Registry.RegisterVersioned]).
type Versioned interface {
	SchemaVersion() int
}

// SchemaVersionOf returns the schema version p declares, 1 when it declares
// none.
func SchemaVersionOf(p Payload) int {
	if v, ok := p.(Versioned); ok {
		return v.SchemaVersion()
	}
	return 1
}

// StrictDecoder is implemented by a payload type that wants its payloads
// read strictly: a field the Go type does not have is an error
// ([*MalformedPayloadError] naming the field) instead of being ignored.
//
// The default is lenient on purpose: a producer that adds an optional field
// is deployed before, or without, its consumers, and a lenient consumer
// keeps working; a strict one holds every event of the type until it is
// redeployed. Be strict where a field the consumer does not understand
// changes the meaning of the event (a new "refund_kind" it would silently
// treat as the default), and deploy consumers first.
type StrictDecoder interface {
	StrictDecoding() bool
}

// Upcaster turns the JSON payload of version From of an event type into
// version From+1. It works on raw JSON because the Go type of version From
// no longer exists: a small function, tested on stored examples of the old
// shape, typically a rename or a split of a field. It must not depend on
// anything but its input: the same stored event is upcast at every replay.
type Upcaster struct {
	From int
	Func func(json.RawMessage) (json.RawMessage, error)
}

// ErrUnknownVersion is what decoding a payload of a schema version newer
// than the registered Go type's returns (as a [*VersionError]): the producer
// was deployed before this consumer. It is retryable, not malformed: package
// idempotency retries it without ever marking it dead, so the event (and its
// aggregate's later events) waits for the consumer's new deployment instead
// of being applied with zero values.
var ErrUnknownVersion = errors.New("schema version newer than this build knows")

// VersionError reports a payload of a schema version the registry cannot
// decode: newer than the registered type's (errors.Is [ErrUnknownVersion]),
// or not a version at all (0, negative, not an integer).
type VersionError struct {
	EventType string
	// Version is the payload's version; 0 when Raw is not a version.
	Version int
	// Known is the registered Go type's version.
	Known int
	// Raw is the metadata value when it is not a positive integer.
	Raw string
}

func (e *VersionError) Error() string {
	if e.Version < 1 {
		return fmt.Sprintf("decode event %q: %s %q is not a positive integer", e.EventType, SchemaVersionKey, e.Raw)
	}
	return fmt.Sprintf("decode event %q: schema version %d is newer than version %d, the newest this build knows: %s",
		e.EventType, e.Version, e.Known, "deploy this consumer with the new version of the type (the event is retried until then)")
}

// Is makes a newer version errors.Is [ErrUnknownVersion].
func (e *VersionError) Is(target error) bool {
	return target == ErrUnknownVersion && e.Version > e.Known && e.Version >= 1
}

// messageSchemaVersion reads the schema version from msg's metadata: 1 when
// absent (an event written before versions existed).
func messageSchemaVersion(eventType string, md message.Metadata) (int, error) {
	raw, ok := md[SchemaVersionKey]
	if !ok || raw == "" {
		return 1, nil
	}
	v, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || v < 1 {
		return 0, &VersionError{EventType: eventType, Raw: raw}
	}
	return v, nil
}
