package cli

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/outflowtest"
)

// A failure to read the outbox's topics is logged, not dropped: a schema
// without the outbox (migrations not run, a wrong search_path) would
// otherwise never trim, silently.
func TestTrimLoopLogsQueryErrors(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t) // no outbox table: the topics' query fails
	var logs outflowtest.LogBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// No broker: the loop fails before it would trim one.
		trimLoop(ctx, s.Pool, nil, 10*time.Millisecond, logger)
	}()
	t.Cleanup(func() { cancel(); <-done })
	outflowtest.WaitFor(t, 10*time.Second, "the query's error logged", func() bool {
		out := logs.String()
		return strings.Contains(out, "trim streams") && strings.Contains(out, "read the outbox's topics") &&
			strings.Contains(out, `outbox`) && strings.Contains(out, "does not exist")
	})
}
