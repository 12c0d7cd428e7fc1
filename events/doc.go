// Package events defines the envelope every Outflow event travels in and a
// registry that maps event types to Go types.
//
// An [Event] is a typed [Payload] plus its [Envelope]: the message id (a
// UUIDv7, which is also the Watermill message UUID and the key consumers
// deduplicate on), the event type, the aggregate it belongs to and the
// aggregate's version after the change, when it occurred, the correlation id
// and, when the request carried one, the W3C traceparent.
//
// The envelope is carried twice on purpose: as Watermill message metadata, so
// that any Watermill subscriber sees it without decoding the payload, and as
// columns of the outbox row (see package outbox), so that the forwarder can
// route and order without parsing JSON.
//
// Payloads are JSON and carry what a consumer needs to act without reading the
// producer's database: amounts in minor units, currency, merchant, timestamps.
// Decoding is strict about what matters and lenient about what does not: an
// unknown event type or a payload that is not valid JSON for its type is an
// error naming the type and the problem ([*UnknownTypeError],
// [*MalformedPayloadError]), while unknown JSON fields are ignored so that
// producers can add fields without breaking consumers; a type that wants
// them reported declares [StrictDecoder].
//
// A payload's JSON shape is versioned: a type declares its version
// ([Versioned]; none is 1), every event written carries it (metadata
// [SchemaVersionKey]), and the registry upcasts an older payload to the Go
// type through a chain of [Upcaster] functions checked at registration
// ([Registry.RegisterVersioned]). A payload newer than the registry knows is
// [ErrUnknownVersion], which consumers retry until they are deployed with
// the new type. See docs/events.md.
package events
