package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

// jsonLog is a JSON slog handler's output, written by the consumer while
// the test reads it.
type jsonLog struct{ outflowtest.LogBuffer }

// line returns the first line whose msg is msg, parsed; nil when none.
func (l *jsonLog) line(t *testing.T, msg string) map[string]any {
	t.Helper()
	s := l.String()
	for _, raw := range strings.Split(strings.TrimSpace(s), "\n") {
		if raw == "" {
			continue
		}
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &v), "line %q", raw)
		if v["msg"] == msg {
			return v
		}
	}
	return nil
}

// The lines about a failing message (its retry, then its dead letter)
// carry the correlation id and the trace id of the request that caused it.
func TestRetryAndDeadLinesCarryCorrelationAndTraceIDs(t *testing.T) {
	t.Parallel()
	b := &bundle{t: t, schema: outflowtest.NewSchema(t)}
	_, err := b.schema.Pool.Exec(context.Background(),
		`CREATE TABLE balances (account text PRIMARY KEY, total bigint NOT NULL, applied bigint[] NOT NULL)`)
	require.NoError(t, err)
	var logs jsonLog
	c, err := idempotency.NewConsumer(idempotency.Config{Pool: b.schema.Pool, Consumer: "balances", MaxAttempts: 2,
		RetryBackoff: time.Millisecond, RetryBackoffMax: 2 * time.Millisecond, RetryPollInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	b.consumer = c
	b.setFail(errors.New("always broken"))

	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx := events.WithTraceparent(events.WithCorrelationID(context.Background(), "req-dead-1"), tp)
	ev, err := events.New(ctx, events.Aggregate{Type: "account", ID: "a", Version: 1}, credited{Amount: 10})
	require.NoError(t, err)
	m, err := ev.Message(ctx)
	require.NoError(t, err)
	_, err = c.Middleware(b.handler)(m)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(rctx) }()
	outflowtest.WaitFor(t, 10*time.Second, "the dead letter logged", func() bool {
		return logs.line(t, "message dead-lettered after max attempts") != nil
	})
	for _, msg := range []string{"handler failed; retry scheduled", "message dead-lettered after max attempts"} {
		l := logs.line(t, msg)
		require.NotNil(t, l, msg)
		require.Equal(t, "req-dead-1", l["correlation_id"], "%s: %v", msg, l)
		require.Equal(t, "0af7651916cd43dd8448eb211c80319c", l["trace_id"], "%s: %v", msg, l)
	}
}
