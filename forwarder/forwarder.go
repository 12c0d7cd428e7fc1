package forwarder

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Forwarder moves committed outbox rows to a broker. Create it with [New]
// and run it with [Forwarder.Run]; run as many instances as you like, in as
// many processes.
type Forwarder struct {
	cfg     Config
	metrics *metrics

	wake chan struct{} // coalesced: a NOTIFY arrived
	low  lowWater      // the claim's low-water mark; the work loop's own

	mu    sync.Mutex
	owned []int32 // partitions leased by this instance, as of the last lease tick
}

// New validates cfg and returns a Forwarder. It starts nothing.
func New(cfg Config) (*Forwarder, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Forwarder{cfg: cfg, metrics: m, wake: make(chan struct{}, 1)}, nil
}

// Run forwards until ctx is done, then finishes the batch in flight, hands
// its partitions back so that other instances take them at once, and
// returns nil. It returns an error only when it cannot start (the schema is
// missing, the partition count disagrees with the database's).
func (f *Forwarder) Run(ctx context.Context) error {
	if err := f.register(ctx); err != nil {
		return err
	}
	f.cfg.Logger.Info("forwarder started", "instance", f.cfg.InstanceID, "partitions", f.cfg.Partitions,
		"batch_size", f.cfg.BatchSize, "takeover_after", f.cfg.TakeoverAfter)

	var wg sync.WaitGroup
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	wg.Go(func() { f.leaseLoop(loopCtx) })
	wg.Go(func() { f.listenLoop(loopCtx) })
	wg.Go(func() { f.statsLoop(loopCtx) })
	if f.cfg.Retention > 0 {
		wg.Go(func() { f.purgeLoop(loopCtx) })
	}
	f.work(ctx) // returns after the batch in flight when ctx is done
	stopLoops()
	wg.Wait()

	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := f.unregister(rctx); err != nil {
		f.cfg.Logger.Warn("release partitions on shutdown", "error", err.Error())
	}
	f.cfg.Logger.Info("forwarder stopped", "instance", f.cfg.InstanceID)
	return nil
}

// work claims and forwards batches until ctx is done.
func (f *Forwarder) work(ctx context.Context) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	outage := time.Duration(0)
	for {
		var (
			res batchResult
			err error
		)
		if f.ownsPartitions() {
			res, err = f.forwardBatch(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil || res.unavailable != nil:
			if err == nil {
				err = res.unavailable
			}
			outage = min(max(2*outage, 100*time.Millisecond), f.cfg.OutageBackoffMax)
			if errors.Is(err, ErrBrokerUnavailable) {
				f.metrics.brokerUnavailable.Inc()
			}
			f.cfg.Logger.Warn("forward batch", "error", err.Error(), "retry_in", outage)
			if !sleep(ctx, outage/2+rand.N(outage/2+1)) {
				return
			}
			continue
		}
		outage = 0
		if res.claimed == f.cfg.BatchSize {
			continue // more is waiting
		}
		// Idle: wait for a notification or the poll.
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(f.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-poll.C:
		}
	}
}

// ownsPartitions reports whether the last lease tick left this instance any
// partition. The claim itself checks the leases in the database.
func (f *Forwarder) ownsPartitions() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.owned) > 0
}

func (f *Forwarder) setPartitions(p []int32) {
	slices.Sort(p)
	f.mu.Lock()
	changed := !slices.Equal(f.owned, p)
	delta := len(p) - len(f.owned)
	f.owned = p
	f.mu.Unlock()
	// Add, not Set: the gauge may be shared with other forwarders of the
	// process, and is then their sum.
	f.metrics.partitionsOwned.Add(float64(delta))
	if changed {
		f.cfg.Logger.Info("partitions leased", "instance", f.cfg.InstanceID, "count", len(p))
		f.notify()
	}
}

func (f *Forwarder) notify() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// sleep waits d or until ctx is done; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ErrPartitionsMismatch is returned by Run when Config.Partitions differs
// from the partition count the database was set up with.
var ErrPartitionsMismatch = errors.New("forwarder: partition count differs from the database's")

func errMismatch(have, want int) error {
	return fmt.Errorf("%w: the database has %d partitions, Config.Partitions is %d; stop every forwarder and run `outflow outbox repartition --partitions %d` to change it",
		ErrPartitionsMismatch, have, want, want)
}
