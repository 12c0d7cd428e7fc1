// Package tracing is Outflow's one place for OpenTelemetry spans: the
// tracer every framework span comes from, and the conversion between a
// span context and the W3C traceparent an envelope carries.
//
// Spans come from the global TracerProvider ([otel.GetTracerProvider]), so
// a process that configures none traces nothing at the cost of a no-op
// call. Even then a span started from a remote parent keeps that parent's
// context (the no-op span carries it), so an incoming traceparent still
// reaches the events written while serving the request, as before tracing.
//
// The trace of a state change, end to end:
//
//   - the API's server span (kind server) is a child of the request's
//     traceparent header, if any; the events written while serving the
//     request carry the server span's traceparent (events.WithTraceparent),
//     so the outbox row holds the context of the span that wrote it;
//   - the forwarder makes one span per Publish call (kind producer, named
//     "send", messaging.operation.type "send"), a batch: it is the root of
//     a trace of its own, linked to each message's creation context, as
//     the messaging semantic conventions ask of batches. The messages keep
//     their creation context unchanged;
//   - each consumer's handling span (kind consumer, "process <topic>") is a
//     child of the message's creation context; the handler's ctx carries
//     that span's traceparent and the event's correlation id, so the events
//     the handler writes continue the trace.
//
// The traceparent is always W3C (propagation.TraceContext), whatever global
// propagator is set: it is the envelope's format and the header the API
// reads.
package tracing
