// Package poll runs a worker's "do what is due, then wait" loop.
package poll

import (
	"context"
	"time"
)

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
