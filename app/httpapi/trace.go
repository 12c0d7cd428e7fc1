package httpapi

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/tracing"
)

// startSpan starts the request's server span, a child of its traceparent
// header when valid, and puts the span's traceparent in ctx so the events
// written while serving the request carry the context of the span that
// wrote them. With no TracerProvider configured the span is a no-op that
// keeps the incoming context: events then carry the header's traceparent.
func (a *API) startSpan(ctx context.Context, r *http.Request) (context.Context, trace.Span) {
	if tp := r.Header.Get("traceparent"); events.ValidTraceparent(tp) {
		ctx = tracing.WithRemoteParent(ctx, tp)
	}
	name := r.Method
	if _, pattern := a.mux.Handler(r); pattern != "" {
		// The route, not the path: span names must stay few.
		name = pattern
		if r.Method != "" && !hasMethod(pattern) {
			name = r.Method + " " + pattern
		}
	}
	ctx, span := tracing.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path)))
	if tp := tracing.SpanTraceparent(ctx); tp != "" {
		ctx = events.WithTraceparent(ctx, tp)
	}
	return ctx, span
}

// endSpan records the response status and ends span.
func endSpan(span trace.Span, status int) {
	span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// hasMethod reports whether a ServeMux pattern starts with a method.
func hasMethod(pattern string) bool {
	return len(pattern) > 0 && pattern[0] != '/'
}
