package poll

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Every calls round at once and then every interval, until ctx is done.
// Errors go to onErr unless ctx ended; the next round tries again.
func Every(ctx context.Context, every time.Duration, round func(context.Context) error, onErr func(error)) {
	DrainOrWake(ctx, every, nil, func(ctx context.Context) (int, error) { return 0, round(ctx) }, onErr)
}

// Drain calls step until it reports no work (0) or fails, then waits every
// before the next round, until ctx is done. Errors go to onErr unless ctx
// ended; the next round tries again.
func Drain(ctx context.Context, every time.Duration, step func(context.Context) (int, error), onErr func(error)) {
	DrainOrWake(ctx, every, nil, step, onErr)
}

// DrainOrWake is Drain whose wait also ends when wake receives: the next
// round starts at once. A nil wake is never ready.
func DrainOrWake(ctx context.Context, every time.Duration, wake <-chan struct{}, step func(context.Context) (int, error), onErr func(error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for {
			n, err := step(ctx)
			if err != nil && ctx.Err() == nil {
				onErr(err)
			}
			if n == 0 || err != nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-t.C:
		}
	}
}

// Warn is the usual onErr: it logs the error at Warn level with msg and
// args.
func Warn(logger *slog.Logger, msg string, args ...any) func(error) {
	return func(err error) {
		logger.Warn(msg, append(args, "error", err.Error())...)
	}
}

// ErrTimeout is Until's error when its condition did not hold in time.
var ErrTimeout = errors.New("condition not met")

// Until calls cond at once and then every interval until it holds (nil),
// fails (its error), ctx ends (ctx's error) or within has passed (an error
// wrapping [ErrTimeout]): the one wait for a condition, under the tests'
// outflowtest.WaitFor, the benchmarks and the demo.
func Until(ctx context.Context, every, within time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		if ok, err := cond(); ok || err != nil {
			return err
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w within %s", ErrTimeout, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
