package events

import "context"

type ctxKey int

const (
	correlationIDKey ctxKey = iota
	traceparentKey
)

// WithCorrelationID returns a context whose events carry id as their
// correlation id.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationIDKey, id)
}

// CorrelationID returns the correlation id stored by [WithCorrelationID], or "".
func CorrelationID(ctx context.Context) string {
	id, _ := ctx.Value(correlationIDKey).(string)
	return id
}

// WithTraceparent returns a context whose events carry the W3C traceparent tp.
func WithTraceparent(ctx context.Context, tp string) context.Context {
	return context.WithValue(ctx, traceparentKey, tp)
}

// Traceparent returns the traceparent stored by [WithTraceparent], or "":
// what the events written with ctx carry, not ctx's span (for that, see
// tracing.SpanTraceparent).
func Traceparent(ctx context.Context) string {
	tp, _ := ctx.Value(traceparentKey).(string)
	return tp
}
