package consumer

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/tracing"
)

// startSpan starts h's handling span for msg, a child of the context that
// created the event (the envelope's traceparent), and returns the handler's
// ctx: it carries the span's traceparent and the event's correlation id, so
// the events the handler writes continue the trace. The span covers the
// handler's own work, inside the idempotency middleware, so a retry from
// dead_letters gets one too; duplicates and held messages get none.
func startSpan(ctx context.Context, h Handler, system string, msg *message.Message) (context.Context, trace.Span) {
	ctx = tracing.WithRemoteParent(ctx, msg.Metadata.Get(events.TraceparentKey))
	ctx, span := tracing.Tracer().Start(ctx, "process "+h.Topic, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(tracing.System(system), tracing.Destination(h.Topic), tracing.OperationProcess,
			tracing.OperationName("process"), tracing.ConsumerGroup(h.Name),
			tracing.MessageID(msg.UUID)))
	if tp := tracing.SpanTraceparent(ctx); tp != "" {
		ctx = events.WithTraceparent(ctx, tp)
	}
	if id := msg.Metadata.Get(events.CorrelationIDKey); id != "" {
		ctx = events.WithCorrelationID(ctx, id)
	}
	return ctx, span
}

// endSpan records the handler's error, if any, and ends span.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
