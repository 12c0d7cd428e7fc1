package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outflow-dev/outflow/tracing"
)

// BenchmarkInstrumentation is the instrumentation's own cost per call site.
// "no provider" is the test binary's state, the process's default: what
// `outflow` runs with unless OTEL_* asks for tracing. "noop provider" is
// the state `outflow-bench tracing` restores between its "on" runs, since
// otel cannot unset a provider. The cost of a whole request or event, with
// tracing on and off, is `outflow-bench tracing`'s (docs/benchmarks.md).
func BenchmarkInstrumentation(b *testing.B) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	cases := []struct {
		name string
		fn   func(context.Context)
	}{
		// The API's server span for a request without a traceparent header,
		// and the traceparent the outbox row would carry (none).
		{"server span, no traceparent", func(ctx context.Context) {
			ctx, span := tracing.Tracer().Start(ctx, "POST /v1/payments/{id}/pay", trace.WithSpanKind(trace.SpanKindServer))
			_ = tracing.SpanTraceparent(ctx)
			span.End()
		}},
		// The consumer's span for a message without a traceparent.
		{"consumer span, no traceparent", func(ctx context.Context) {
			ctx = tracing.WithRemoteParent(ctx, "")
			ctx, span := tracing.Tracer().Start(ctx, "process payments", trace.WithSpanKind(trace.SpanKindConsumer))
			_ = tracing.SpanTraceparent(ctx)
			span.End()
		}},
		// The same for a message whose row carries a traceparent (a request
		// that came with one): off, the context is still passed on, so the
		// handler's own events keep the caller's trace.
		{"consumer span, with traceparent", func(ctx context.Context) {
			ctx = tracing.WithRemoteParent(ctx, tp)
			ctx, span := tracing.Tracer().Start(ctx, "process payments", trace.WithSpanKind(trace.SpanKindConsumer))
			_ = tracing.SpanTraceparent(ctx)
			span.End()
		}},
		// The forwarder's send span per wave (links only when recording).
		{"forwarder send span", func(ctx context.Context) {
			_, span := tracing.Tracer().Start(ctx, "send payments", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindProducer))
			_ = span.IsRecording()
			span.End()
		}},
	}
	run := func(b *testing.B) {
		for _, c := range cases {
			b.Run(c.name, func(b *testing.B) {
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					c.fn(ctx)
				}
			})
		}
	}
	b.Run("no provider", run)
	with := func(name string, tp trace.TracerProvider) {
		b.Run(name, func(b *testing.B) {
			prev := otel.GetTracerProvider()
			otel.SetTracerProvider(tp)
			b.Cleanup(func() { otel.SetTracerProvider(prev) })
			run(b)
		})
	}
	with("noop provider", noop.NewTracerProvider())
	// For scale: the SDK with nothing sampled, and with everything sampled
	// into the batch processor (an exporter that drops the batches).
	with("sdk NeverSample", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
	on := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discard{}))
	b.Cleanup(func() { _ = on.Shutdown(context.Background()) })
	with("sdk AlwaysSample", on)
}

// discard is a SpanExporter that drops every batch.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }
