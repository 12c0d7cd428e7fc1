package tracing_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outflow-dev/outflow/tracing"
)

func TestSpanContext(t *testing.T) {
	for _, tt := range []struct {
		name, tp string
		valid    bool
	}{
		{"sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"not sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"empty", "", false},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"zero span id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"upper case", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", false},
		{"garbage", "not a traceparent", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sc := tracing.SpanContext(tt.tp)
			require.Equal(t, tt.valid, sc.IsValid())
			if !tt.valid {
				// No parent: a span started under it roots a new trace.
				require.Empty(t, tracing.SpanTraceparent(tracing.WithRemoteParent(context.Background(), tt.tp)))
				return
			}
			require.True(t, sc.IsRemote())
			// The round trip: the traceparent of a context holding it.
			require.Equal(t, tt.tp, tracing.SpanTraceparent(trace.ContextWithSpanContext(context.Background(), sc)))
		})
	}
}

func TestLinksSkipInvalidAndRepeats(t *testing.T) {
	a := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b8-01"
	links := tracing.Links([]string{a, "", "junk", b, a})
	require.Len(t, links, 2)
	require.Equal(t, "00f067aa0ba902b7", links[0].SpanContext.SpanID().String())
	require.Equal(t, "00f067aa0ba902b8", links[1].SpanContext.SpanID().String())
}

// With no TracerProvider configured, a span started under a remote parent
// keeps the parent's context: the traceparent passes through unchanged.
func ExampleWithRemoteParent() {
	ctx := tracing.WithRemoteParent(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ctx, span := tracing.Tracer().Start(ctx, "work")
	defer span.End()
	fmt.Println(tracing.SpanTraceparent(ctx))
	// Output: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}
