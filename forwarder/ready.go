package forwarder

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// leaseHealth is what the lease loop last saw, for Ready.
type leaseHealth struct {
	mu      sync.Mutex
	running bool
	ok      time.Time // the last lease tick that succeeded
	err     error     // of the last tick, nil when it succeeded
}

func (h *leaseHealth) note(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running = true
	h.err = err
	if err == nil {
		h.ok = time.Now()
	}
}

func (h *leaseHealth) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running = false
}

// Ready returns nil when this instance holds partitions or is able to take
// them: Run is running and its last lease tick, within TakeoverAfter,
// succeeded. An instance holding none after a successful tick is ready: with
// more instances than partitions, none is its fair share. Otherwise the
// error says why (not started or stopped, the database failing the lease
// tick, or no tick for too long), for a readiness probe.
func (f *Forwarder) Ready() error {
	h := &f.lease
	h.mu.Lock()
	running, ok, err := h.running, h.ok, h.err
	h.mu.Unlock()
	f.mu.Lock()
	owned := len(f.owned)
	f.mu.Unlock()
	switch {
	case !running:
		return errors.New("forwarder: not running")
	case err != nil:
		return fmt.Errorf("forwarder: lease renewal failed, holding no partition: %w", err)
	case time.Since(ok) > f.cfg.TakeoverAfter:
		return fmt.Errorf("forwarder: no lease renewal for %s (holding %d partitions)", time.Since(ok).Round(time.Second), owned)
	}
	return nil
}
