package outflowtest

import (
	"context"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/internal/poll"
)

// WaitFor polls cond until it holds, failing t with what after timeout: the
// way to wait for asynchronous work without sleeping a guessed time.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if poll.Until(context.Background(), 10*time.Millisecond, timeout, func() (bool, error) { return cond(), nil }) != nil {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}
