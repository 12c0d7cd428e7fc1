package forwarder

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/tracing"
)

// publish hands one wave to the broker inside a producer span. A wave is a
// batch, possibly of several topics and traces, so the span is the root of
// a trace of its own, linked to each message's creation context (the
// outbox row's traceparent), as the messaging semantic conventions ask of a
// batch send. The messages keep their creation context: a consumer's span
// is its child, not the publish span's. When the broker is audited, it
// returns the broker's receipts too (nil otherwise).
func (f *Forwarder) publish(ctx context.Context, wave []Outgoing) ([]Receipt, []error) {
	name, topic := "send", wave[0].Topic
	for _, m := range wave[1:] {
		if m.Topic != topic {
			topic = "" // several destinations: the name says none
			break
		}
	}
	attrs := []attribute.KeyValue{tracing.System(f.cfg.MessagingSystem), tracing.OperationSend,
		tracing.OperationName("send"), tracing.BatchSize(len(wave))}
	if topic != "" {
		name += " " + topic
		attrs = append(attrs, tracing.Destination(topic))
	}
	_, span := tracing.Tracer().Start(ctx, name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrs...))
	defer span.End()
	// Links are added only to a recorded span: with tracing off, the wave
	// costs no traceparent parsing.
	if span.IsRecording() {
		tps := make([]string, len(wave))
		for i, m := range wave {
			tps[i] = m.Message.Metadata.Get(events.TraceparentKey)
		}
		for _, l := range tracing.Links(tps) {
			span.AddLink(l)
		}
	}
	var (
		receipts []Receipt
		errs     []error
	)
	if f.auditor != nil {
		receipts, errs = f.auditor.PublishReceipts(ctx, wave)
	} else {
		errs = f.cfg.Broker.Publish(ctx, wave)
	}
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if failed > 0 {
		span.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages not published", failed, len(wave)))
	}
	return receipts, errs
}
