package handlers

import (
	"net/http"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outflow-dev/outflow/tracing"
)

// startClientSpan starts a webhook request's client span, a child of the
// context that recorded the delivery (tp), and sets the request's
// traceparent header to the span's context, so the merchant's own trace
// continues ours. With tracing off the header carries tp itself. The span
// names the host only: a URL's path and query may hold the merchant's
// secrets.
func startClientSpan(req *http.Request, tp string) (*http.Request, trace.Span) {
	ctx := tracing.WithRemoteParent(req.Context(), tp)
	ctx, span := tracing.Tracer().Start(ctx, req.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(req.Method), semconv.ServerAddress(req.URL.Hostname())))
	if tp := tracing.SpanTraceparent(ctx); tp != "" {
		req.Header.Set("traceparent", tp)
	}
	return req.WithContext(ctx), span
}

// endClientSpan records the attempt's outcome and ends span.
func endClientSpan(span trace.Span, r result) {
	if r.code != 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(r.code))
	}
	if r.err != nil || r.code >= 400 {
		msg := http.StatusText(r.code)
		if r.err != nil {
			msg = r.err.Error()
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}
