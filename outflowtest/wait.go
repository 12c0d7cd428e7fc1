package outflowtest

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds, failing t with what after timeout: the
// way to wait for asynchronous work without sleeping a guessed time.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
