package poll_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/internal/poll"
)

// The first round runs at once, not an interval later, and its error
// reaches onErr.
func TestEveryRunsWorkFirstAndReportsErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	boom := errors.New("boom")
	got := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		poll.Every(ctx, time.Hour, func(context.Context) error { return boom }, func(err error) { got <- err })
	}()
	select {
	case err := <-got:
		if !errors.Is(err, boom) {
			t.Fatalf("onErr got %v, want %v", err, boom)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no round before the first interval")
	}
	cancel()
	<-done
}

// An error of a round the context's end interrupted is the stop, not a
// failure: onErr does not get it.
func TestEveryQuietOnceCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	poll.Every(ctx, time.Hour, func(ctx context.Context) error {
		cancel()
		return ctx.Err()
	}, func(err error) { t.Errorf("onErr got %v after the context ended", err) })
}

// Until returns as the condition holds, with its error, with
// ErrTimeout once its time is up (having asked at least once), or with the
// context's error.
func TestUntil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := 0
	if err := poll.Until(ctx, time.Millisecond, time.Minute, func() (bool, error) { n++; return n == 3, nil }); err != nil || n != 3 {
		t.Fatalf("Until = %v after %d calls, want nil after 3", err, n)
	}
	boom := errors.New("boom")
	if err := poll.Until(ctx, time.Millisecond, time.Minute, func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Fatalf("Until = %v, want %v", err, boom)
	}
	n = 0
	if err := poll.Until(ctx, time.Millisecond, 0, func() (bool, error) { n++; return false, nil }); !errors.Is(err, poll.ErrTimeout) || n != 1 {
		t.Fatalf("Until = %v after %d calls, want ErrTimeout after 1", err, n)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := poll.Until(cctx, time.Hour, time.Hour, func() (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Until = %v, want %v", err, context.Canceled)
	}
}
