// Package subloop runs the delivery loop of Outflow's Watermill subscribers
// (Redis Streams, NATS): one goroutine per subscription that stops when the
// Subscribe context is done or the subscriber closes, interrupting a read
// in flight rather than waiting for it, and closes its channel last.
package subloop

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Start runs loop in a goroutine counted by wg and returns its channel.
// loop's context is cancelled when ctx is done or closing is closed; the
// channel is closed when loop returns.
func Start(ctx context.Context, closing <-chan struct{}, wg *sync.WaitGroup, loop func(ctx context.Context, out chan<- *message.Message)) <-chan *message.Message {
	out := make(chan *message.Message)
	lctx, cancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(out)
		defer cancel()
		go func() {
			select {
			case <-closing:
				cancel()
			case <-lctx.Done():
			}
		}()
		loop(lctx, out)
	}()
	return out
}

// Sleep waits d, or less if ctx is done first; it reports whether it waited
// the whole time.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
