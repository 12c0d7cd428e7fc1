package forwarder

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/subloop"
)

// Forwarder moves committed outbox rows to a broker. Create it with [New]
// and run it with [Forwarder.Run]; run as many instances as you like, in as
// many processes.
type Forwarder struct {
	cfg     Config
	metrics *metrics

	wake chan struct{} // coalesced: Wake was called, or the leases changed
	cur  *cursor       // where the claims stand; the work loop's own

	claimSQL string // claimTemplate for cfg.BatchSize

	mu    sync.Mutex
	owned []int32 // partitions leased by this instance, as of the last lease tick

	lease leaseHealth // for Ready

	// repartitioning: the last lease tick saw a next partition set (see
	// RepartitionOnline); the idle work loop claims once a lease interval
	// so that its cursor passes the old set's last id.
	repartitioning atomic.Bool

	// auditor is cfg.Broker as an Auditor, nil when it is none or the
	// audit is off; receipts are those of its batches not yet written.
	auditor  Auditor
	receipts pendingReceipts
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
	f := &Forwarder{cfg: cfg, metrics: m, wake: make(chan struct{}, 1), cur: newCursor(),
		claimSQL: claimQuery(cfg.BatchSize)}
	if a, ok := cfg.Broker.(Auditor); ok && cfg.AuditInterval > 0 {
		f.auditor = a
	}
	return f, nil
}

// Audits reports whether this forwarder keeps receipts and audits the
// broker: its Broker is an [Auditor] and Config.AuditInterval is positive.
// Run the audit on every instance or on none: an instance that does not
// audit keeps no receipts for the auditor to check.
func (f *Forwarder) Audits() bool { return f.auditor != nil }

// Run forwards until ctx is done, then finishes the batch in flight, hands
// its partitions back so that other instances take them at once, and
// returns nil, also when ctx is done while it starts. It returns an error
// only when it cannot start (the schema is missing, the partition count
// disagrees with the database's).
func (f *Forwarder) Run(ctx context.Context) error {
	if err := f.register(ctx); err != nil {
		if ctx.Err() == nil {
			return err
		}
		// Stopped while starting: a shutdown, not a failure to start. The
		// registration may have committed before the cancellation reached
		// its client: take it back, as a stop does.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := f.unregister(rctx); err != nil {
			f.cfg.Logger.Warn("release partitions on shutdown", "error", err.Error())
		}
		return nil
	}
	f.cfg.Logger.Info("forwarder started", "instance", f.cfg.InstanceID, "partitions", f.cfg.Partitions,
		"batch_size", f.cfg.BatchSize, "takeover_after", f.cfg.TakeoverAfter)

	var wg sync.WaitGroup
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	wg.Go(func() { f.leaseLoop(loopCtx) })
	wg.Go(func() { f.statsLoop(loopCtx) })
	if f.cfg.Retention > 0 {
		wg.Go(func() { f.purgeLoop(loopCtx) })
	}
	if f.auditor != nil {
		wg.Go(func() { f.auditLoop(loopCtx) })
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

// work claims and forwards batches until ctx is done. Between claims it
// polls with an adaptive interval (see waitForRows): no notification from
// the producers' transactions is needed, so none can serialise their
// commits.
func (f *Forwarder) work(ctx context.Context) {
	idle := f.cfg.MinPollInterval // the next wait when no row is found
	var lastRows time.Time        // when a claim last found rows
	outages := 0                  // failed batches in a row
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
			outages++
			wait := backoff.Delay(backoff.ReconnectBase, f.cfg.OutageBackoffMax, outages)
			if errors.Is(err, ErrBrokerUnavailable) {
				f.metrics.brokerUnavailable.Inc()
			}
			f.cfg.Logger.Warn("forward batch", "error", err.Error(), "retry_in", wait)
			if !subloop.Sleep(ctx, wait) {
				return
			}
			continue
		}
		outages = 0
		if res.claimed > 0 {
			// Rows are flowing: claim again at once, as the NOTIFY of every
			// commit used to make it do. Waiting even MinPollInterval here
			// doubled the median commit-to-stream latency at 1,000 events/s
			// (docs/benchmarks.md).
			idle = f.cfg.MinPollInterval
			lastRows = time.Now()
			continue
		}
		if !f.waitForRows(ctx, &idle, lastRows) {
			return
		}
	}
}

// busyWindow and busyPollCap keep a forwarder that found rows recently
// looking often: under a steady flow the commits come in bursts with gaps
// (the producers share the CPU), and a wait doubled to PollInterval across
// such a gap made the p99 commit-to-stream latency at 1,000 events/s 120-210
// ms instead of 30-60 (docs/benchmarks.md). For busyWindow after the last
// row found the wait doubles only up to busyPollCap.
const (
	busyWindow  = time.Second
	busyPollCap = 16 * time.Millisecond
)

// waitForRows waits until a claim is worth making: a Wake (or a lease
// change), or a look for work (probeSQL) after *idle that finds some, or,
// once a LeaseRenewInterval, a tracked transaction holding the durable
// cursor back (see cursor.rebound: only a claim asks who writes to the
// outbox, and an idle forwarder would otherwise keep a stale bound, and
// the partitions' history, until the next row). Each look that finds none
// doubles *idle up to PollInterval (up to
// busyPollCap within busyWindow of lastRows); a Wake brings it back to
// MinPollInterval. The look is a probe (probeSQL), not the claim's
// transaction: measured, a fifth of its cost, and it writes nothing. It
// reports false when ctx is done.
func (f *Forwarder) waitForRows(ctx context.Context, idle *time.Duration, lastRows time.Time) bool {
	t := time.NewTimer(*idle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-f.wake:
			*idle = f.cfg.MinPollInterval
			return true
		case <-t.C:
		}
		limit := f.cfg.PollInterval
		if time.Since(lastRows) < busyWindow {
			limit = min(limit, max(busyPollCap, f.cfg.MinPollInterval))
		}
		*idle = min(2**idle, limit)
		if f.ownsPartitions() && (f.rowsPending(ctx) || f.cur.needsReboundIdle(time.Now(), f.cfg.LeaseRenewInterval) ||
			f.repartitioning.Load() && time.Since(lastRows) >= f.cfg.LeaseRenewInterval) {
			return true
		}
		t.Reset(*idle)
	}
}

// probeSQL is the idle look for work: one statement, no transaction id, no
// lock. Work is a row above the cursor's lowest high ($1), a row of
// outbox_failures that is due, or a tracked transaction ($2) now
// committed, whose late rows are to be read. It does not look at
// partitions: a row of another instance's partition makes this one claim,
// find nothing and move its highs past it.
const probeSQL = `SELECT EXISTS (SELECT 1 FROM outbox WHERE id > $1)
    OR EXISTS (SELECT 1 FROM outbox_failures WHERE parked_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= now()))
    OR EXISTS (SELECT 1 FROM unnest($2::text[]) x WHERE pg_xact_status(x::xid8) = 'committed')`

// rowsPending reports whether the probe found work; an error says yes, so
// that the claim runs and reports it.
func (f *Forwarder) rowsPending(ctx context.Context) bool {
	low := int64(-1)
	for _, h := range f.cur.high {
		if low < 0 || h < low {
			low = h
		}
	}
	if low < 0 {
		return true // no partition seen yet: the claim learns them
	}
	xs, _ := f.cur.trackedArgs()
	var found bool
	if err := f.cfg.Pool.QueryRow(ctx, probeSQL, low, xs).Scan(&found); err != nil {
		return ctx.Err() == nil
	}
	return found
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
	old := f.owned
	f.owned = p
	f.mu.Unlock()
	// Add, not Set: the gauge may be shared with other forwarders of the
	// process, and is then their sum.
	f.metrics.partitionsOwned.Add(float64(delta))
	if changed {
		f.markHeld(old, p)
		f.cfg.Logger.Info("partitions leased", "instance", f.cfg.InstanceID, "count", len(p))
		f.Wake()
	}
}

// markHeld moves partition_held from the partitions this instance left to
// those it took. Add, not Set, for the same reason as partitions_owned.
func (f *Forwarder) markHeld(old, now []int32) {
	for _, p := range old {
		if !slices.Contains(now, p) {
			f.metrics.partitionHeld.WithLabelValues(strconv.Itoa(int(p))).Add(-1)
		}
	}
	for _, p := range now {
		if !slices.Contains(old, p) {
			f.metrics.partitionHeld.WithLabelValues(strconv.Itoa(int(p))).Add(1)
		}
	}
}

// Wake makes the forwarder look for rows now instead of at its next poll,
// and brings its poll interval back to MinPollInterval. A writer in the same
// process calls it after its transaction commits (see the package doc);
// calls coalesce, never block, and may come before Run or after it
// returned. A missed or lost wake costs latency only: the poll always runs.
func (f *Forwarder) Wake() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// ErrPartitionsMismatch was returned by Run when Config.Partitions
// differed from the database's partition count.
//
// Deprecated: no longer returned: the database's count rules (it changes
// online, see [RepartitionOnline]); Config.Partitions makes the first.
var ErrPartitionsMismatch = errors.New("forwarder: partition count differs from the database's")
