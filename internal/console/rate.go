package console

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/outflow-dev/outflow/internal/poll"
)

// DefaultRateSampleInterval is how often [Console.Run] samples the
// overview's numbers.
const DefaultRateSampleInterval = 5 * time.Second

// DefaultRateWindow is how far back the overview's published rate looks.
const DefaultRateWindow = 60 * time.Second

// rateMinGap is the least time between two kept samples: the live refresh
// of every open overview reads every 2s, and a ring of samples a few
// milliseconds apart would hold less history, not more precision.
const rateMinGap = time.Second

// maxRateAge bounds the interval a rate is computed over when only old
// samples are left (no Run, an overview read now and then): a rate over
// hours says nothing about now.
const maxRateAge = 5 * time.Minute

type rateSample struct {
	total int64
	at    time.Time
}

// rateOver is the published rate from samples (oldest first) to now, in
// events per second. The total is a sum of per-partition counters that
// restart when partitions are recreated or a forwarder's counters are
// reset: an interval over which it went down says nothing of what was
// published in it, so it counts neither its events nor its time. ok is
// false when no interval is left.
func rateOver(samples []rateSample, now rateSample) (perSecond float64, ok bool) {
	var (
		events int64
		span   time.Duration
	)
	for i, s := range samples {
		next := now
		if i+1 < len(samples) {
			next = samples[i+1]
		}
		el := next.at.Sub(s.at)
		if el < 0 || next.total < s.total {
			continue
		}
		events += next.total - s.total
		span += el
	}
	if span <= 0 {
		return 0, false
	}
	return float64(events) / span.Seconds(), true
}

// rateRing keeps the samples of the last window, oldest first, and at
// least the newest one. Callers hold Console.mu.
type rateRing struct {
	window  time.Duration
	samples []rateSample
}

// add records s unless the newest sample is less than rateMinGap older, and
// drops the samples before the window (always keeping the newest).
func (r *rateRing) add(s rateSample) {
	// A sample taken before the newest one (the sampler and a read race
	// for the lock) is dropped: the ring stays in time order.
	if n := len(r.samples); n == 0 || s.at.Sub(r.samples[n-1].at) >= rateMinGap {
		r.samples = append(r.samples, s)
	}
	cut := 0
	for cut < len(r.samples)-1 && s.at.Sub(r.samples[cut].at) > r.window {
		cut++
	}
	if cut > 0 {
		r.samples = append(r.samples[:0], r.samples[cut:]...)
	}
}

// rate is the published rate over the window, up to this read of total,
// stamped at when its read started:
// from the samples Run takes (so the first overview already has one) and
// those of earlier overview reads (all there is when Run is not running).
func (c *Console) rate(total int64, at time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := rateSample{total: total, at: at}
	var base []rateSample
	for _, s := range c.rates.samples {
		if now.at.Sub(s.at) <= maxRateAge {
			base = append(base, s)
		}
	}
	r, ok := rateOver(base, now)
	c.rates.add(now)
	if !ok {
		return "n/a"
	}
	if r >= 1000 { // a person reads 12,345/s, not 12345.4/s
		return thousands(int64(math.Round(r))) + "/s"
	}
	return fmt.Sprintf("%.1f/s", r)
}

// Run samples (see [Console.Sample]) every RateSampleInterval until ctx is
// done, so that the overview's rate covers the last RateWindow from its
// first render, and its status line and charts the last hour. A sample is
// one overview's reads, whoever looks: every 5 s by default, a few ms of
// the database's time at the sizes of docs/benchmarks.md. It returns nil
// when ctx ends; a failed sample is logged and the next one tries again.
// Without Run the rate is computed from overview reads alone, and the
// charts and the rules over time have nothing to show.
func (c *Console) Run(ctx context.Context) error {
	poll.Every(ctx, c.cfg.RateSampleInterval, c.Sample, poll.Warn(c.log, "console: sample"))
	return nil
}
