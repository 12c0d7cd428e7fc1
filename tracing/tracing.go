package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of Outflow's spans.
const ScopeName = "github.com/outflow-dev/outflow"

// Tracer returns the tracer of the global TracerProvider, looked up per
// call so that a provider set after start-up (otel.SetTracerProvider) is
// used.
func Tracer() trace.Tracer { return otel.GetTracerProvider().Tracer(ScopeName) }

var w3c propagation.TraceContext

// SpanTraceparent returns the W3C traceparent of ctx's span, or "" when ctx
// has no valid span context. (events.Traceparent is another question: the
// traceparent a caller attached to the events it writes with ctx.)
func SpanTraceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c.Get("traceparent")
}

// SpanContext parses a W3C traceparent into a remote span context; the
// result is invalid when tp is empty or malformed.
func SpanContext(tp string) trace.SpanContext {
	if tp == "" {
		return trace.SpanContext{}
	}
	ctx := w3c.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	return trace.SpanContextFromContext(ctx)
}

// WithRemoteParent returns ctx with tp's span context as the parent of the
// next span started from it; ctx unchanged when tp is not valid.
func WithRemoteParent(ctx context.Context, tp string) context.Context {
	sc := SpanContext(tp)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Links returns a link to each valid traceparent in tps, skipping the
// others and repeats.
func Links(tps []string) []trace.Link {
	var links []trace.Link
	seen := make(map[trace.SpanID]bool, len(tps))
	for _, tp := range tps {
		sc := SpanContext(tp)
		if !sc.IsValid() || seen[sc.SpanID()] {
			continue
		}
		seen[sc.SpanID()] = true
		links = append(links, trace.Link{SpanContext: sc})
	}
	return links
}

// Messaging attributes (OpenTelemetry semantic conventions), shared by the
// forwarder's and the consumers' spans.
var (
	OperationSend    = semconv.MessagingOperationTypeSend
	OperationProcess = semconv.MessagingOperationTypeProcess
)

// System is the messaging.system attribute; system is the backend's kind
// (redis, nats, kafka...), "outflow" when unknown.
func System(system string) attribute.KeyValue {
	if system == "" {
		system = "outflow"
	}
	return semconv.MessagingSystemKey.String(system)
}

// Destination is the messaging.destination.name attribute.
func Destination(topic string) attribute.KeyValue {
	return semconv.MessagingDestinationNameKey.String(topic)
}

// BatchSize is the messaging.batch.message_count attribute.
func BatchSize(n int) attribute.KeyValue { return semconv.MessagingBatchMessageCountKey.Int(n) }

// MessageID is the messaging.message.id attribute.
func MessageID(id string) attribute.KeyValue { return semconv.MessagingMessageIDKey.String(id) }

// ConsumerGroup is the messaging.consumer.group.name attribute.
func ConsumerGroup(name string) attribute.KeyValue {
	return semconv.MessagingConsumerGroupNameKey.String(name)
}

// OperationName is the messaging.operation.name attribute.
func OperationName(name string) attribute.KeyValue {
	return semconv.MessagingOperationNameKey.String(name)
}
