// Package schemacheck checks, before a build ships, that the event types
// it registers still read every event stored with an older build, and
// (in Forward mode) that consumers on the older build read what it writes.
//
// A [Snapshot] is a committed JSON file recording, for each event type, the
// JSON shape of each of its schema versions as encoding/json sees its Go
// type ([ShapeOf]): field names (tags, embedded structs, "-"), kinds,
// nested objects, time.Time as a date-time string, types with their own
// MarshalJSON/UnmarshalJSON or MarshalText/UnmarshalText as opaque (their
// Go type name), and whether a field is required (the producer always
// writes it: no omitzero, no omitempty but on a struct, which it does not
// omit, not a pointer or interface).
// Once a type moves to a new version, the older version's entry stays in
// the file as it was: it describes events still in the outbox's history,
// on the broker, in dead letters, in every replay.
//
// [Compare] checks an events.Registry against a snapshot and returns the
// [Violation]s of the [Mode] asked, in the spirit of Confluent Schema
// Registry's: [Backward] (the default; the new code reads every stored
// event), [Forward] (consumers on the old code read the new events),
// [Full] (both). At the same schema version it compares the shapes field by
// field (a changed type, a new required field, a removed one, a likely
// rename); for every older version in the snapshot it decodes a sample
// payload of that version's shape through Registry.DecodeVersion, the
// upcaster chain a consumer runs, so that an upcaster that does not handle
// the old shape fails here rather than on a replay. [Update] records the
// registry's current versions, keeping the frozen ones.
//
// Two front ends run it: outflowtest.RequireCompatibleEvents in a
// service's tests, and `outflow events check` for the reference app. The
// rules, per mode, are tabled in docs/events.md ("Checking compatibility").
package schemacheck
