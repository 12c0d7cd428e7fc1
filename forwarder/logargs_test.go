package forwarder_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The line about a parked row carries the correlation id and the trace id
// of the request that wrote it.
func TestParkedLineCarriesCorrelationAndTraceIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := events.WithTraceparent(events.WithCorrelationID(context.Background(), "req-park-1"), tp)
	ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: "x", Version: 1}, testPayload{N: 1, Pad: strings.Repeat("p", 2000)})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, e.schema.Pool, func(tx pgx.Tx) error { return e.writer.PublishTx(ctx, tx, ev) }))

	var logs outflowtest.LogBuffer
	e.run(e.config(func(c *forwarder.Config) {
		c.MaxPayloadBytes = 1000
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}))
	outflowtest.WaitFor(t, 20*time.Second, "the row parked and logged", func() bool {
		return strings.Contains(logs.String(), "outbox row parked")
	})
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &v), "line %q", l)
		if v["msg"] == "outbox row parked" {
			require.Equal(t, "req-park-1", v["correlation_id"], "line %q", l)
			require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", v["trace_id"], "line %q", l)
			return
		}
	}
	t.Fatalf("no parked line in %s", logs.String())
}
