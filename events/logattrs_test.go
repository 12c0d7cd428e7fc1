package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
)

func TestTraceID(t *testing.T) {
	for _, tc := range []struct{ name, tp, want string }{
		{"w3c", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"empty", "", ""},
		{"malformed", "00-4bf92f3577b34da6a3ce929d0e0e4736-01", ""},
		{"upper case is not w3c", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, events.TraceID(tc.tp))
		})
	}
}

func TestLogArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  events.Envelope
		want []any
	}{
		{"both", events.Envelope{CorrelationID: "req-1", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			[]any{"correlation_id", "req-1", "trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"}},
		{"correlation only", events.Envelope{CorrelationID: "req-1"}, []any{"correlation_id", "req-1"}},
		{"none", events.Envelope{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.env.LogArgs())
		})
	}
}
