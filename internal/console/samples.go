package console

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outflow-dev/outflow/internal/healthrules"
)

// historyWindow is how far back the overview's charts look, and how long
// the console keeps its samples.
const historyWindow = time.Hour

// maxHistory bounds the samples kept, whatever the sampling interval:
// one a rateMinGap over the window.
const maxHistory = int(historyWindow/rateMinGap) + 1

// maxAttemptsPerSample bounds the webhook attempts one sample counts: after
// a long pause the sampler catches up over several samples instead of
// reading every attempt since in one go.
const maxAttemptsPerSample = 100_000

// qAttemptsSince counts the webhook attempts recorded after $1 (by id, the
// primary key's range), and the failed ones among them: those that were
// not delivered (an error, or a status outside 2xx) and whose result
// counted (not lease_lost), the outcomes retry and dead of
// outflow_webhook_attempts_total.
const qAttemptsSince = `
	SELECT count(*),
	       count(*) FILTER (WHERE NOT lease_lost AND (error IS NOT NULL OR status_code IS NULL OR status_code NOT BETWEEN 200 AND 299)),
	       coalesce(max(id), $1)
	FROM webhook_endpoint_attempts WHERE id > $1 AND id <= $1 + $2`

// sample is what the console saw at one time: the health rules' snapshot
// and the published total, for the charts and the status line.
type sample struct {
	snap        healthrules.Snapshot
	published   int64
	publishedOK bool
}

// healthState is the console's memory for health at a glance: the last
// hour of samples and the webhook attempts counted so far. Its fields are
// guarded by Console.mu, but for the attempts' cursor, which only sampleAt
// uses, serialised by sampling.
type healthState struct {
	history []sample // oldest first, at most maxHistory, within historyWindow of the newest
	charts  chartCache

	sampling sync.Mutex // one sample at a time: the attempts' cursor
	cursor   int64      // the last webhook attempt counted
	counted  bool       // the cursor is placed: the first sample places it
	attempts int64
	failed   int64
}

// addHistory keeps s, in time order, unless the newest sample is less than
// rateMinGap older, and drops the samples older than historyWindow.
// Callers hold c.mu.
func (h *healthState) add(s sample) {
	n := len(h.history)
	if n > 0 && s.snap.At.Sub(h.history[n-1].snap.At) < rateMinGap {
		return
	}
	h.history = append(h.history, s)
	cut := 0
	for cut < len(h.history)-1 && (s.snap.At.Sub(h.history[cut].snap.At) > historyWindow || len(h.history)-cut > maxHistory) {
		cut++
	}
	if cut > 0 {
		h.history = append(h.history[:0], h.history[cut:]...)
	}
}

// snapshot is o as the health rules read it: what o could not read is left
// out.
func (c *Console) snapshot(o overview) healthrules.Snapshot {
	s := healthrules.Snapshot{At: o.At}
	if _, bad := o.Unavailable["outbox"]; !bad {
		s.Outbox = &healthrules.Outbox{
			OldestPendingAge: time.Duration(o.Outbox.OldestPendingAgeSeconds * float64(time.Second)),
			Parked:           o.Outbox.Parked,
		}
	}
	_, deadUnknown := o.Unavailable["consumers"]
	for _, cr := range o.Consumers {
		hc := healthrules.Consumer{Name: cr.Name, Topic: cr.Topic, Dead: cr.Dead, DeadKnown: !deadUnknown}
		if cr.lag != nil {
			hc.Lag = &healthrules.Lag{Events: cr.lag.Events, OldestAge: cr.lag.OldestAge}
		}
		s.Consumers = append(s.Consumers, hc)
	}
	if _, bad := o.Unavailable["webhooks"]; !bad && o.Webhooks != nil {
		// The failed deliveries are the rules' dead: given up.
		s.Webhooks = &healthrules.Webhooks{Failing: o.Webhooks.Failing, Dead: o.Webhooks.Failed}
	}
	return s
}

// Sample takes one sample now: the overview's reads (each bounded by
// ReadTimeout, as the overview's) and the webhook attempts recorded since
// the last sample. Run calls it every RateSampleInterval; the overview's
// rate, status line and charts are computed from these samples. A server
// that calls it once before it listens shows a rate on its very first
// overview. A part it cannot read is left out of the sample, and logged.
func (c *Console) Sample(ctx context.Context) error { return c.SampleAt(ctx, c.now()) }

// SampleAt is Sample stamped at instead of now: the render benchmark fills
// the last hour's history with it. Samples are kept in time order: one
// stamped before the newest kept is dropped.
func (c *Console) SampleAt(ctx context.Context, at time.Time) error {
	c.health.sampling.Lock()
	defer c.health.sampling.Unlock()
	o := c.readOverview(ctx)
	o.At = at
	snap := c.snapshot(o)
	var errAttempts error
	if snap.Webhooks != nil {
		if errAttempts = c.countAttempts(ctx); errAttempts == nil {
			snap.Webhooks.Attempts, snap.Webhooks.FailedAttempts = c.health.attempts, c.health.failed
			snap.Webhooks.AttemptsKnown = c.health.counted
		}
	}
	_, outboxBad := o.Unavailable["outbox"]
	c.mu.Lock()
	if !outboxBad {
		c.rates.add(rateSample{total: o.Outbox.PublishedTotal, at: at})
	}
	c.health.add(sample{snap: snap, published: o.Outbox.PublishedTotal, publishedOK: !outboxBad})
	c.mu.Unlock()
	if outboxBad {
		return fmt.Errorf("console: sample: the outbox: %s", o.Unavailable["outbox"])
	}
	return errAttempts
}

// countAttempts adds the webhook attempts recorded since the last sample
// to the counts. The first sample only places the cursor: the attempts
// before the console started are not in its window. An attempt whose
// transaction commits after a later one's was counted (ids are taken at
// insert) is missed; the ratio is an estimate of the alert's.
func (c *Console) countAttempts(ctx context.Context) error {
	h := &c.health
	rctx, cancel := context.WithTimeout(ctx, c.cfg.ReadTimeout)
	defer cancel()
	if !h.counted {
		if err := c.cfg.Pool.QueryRow(rctx, `SELECT coalesce(max(id), 0) FROM webhook_endpoint_attempts`).Scan(&h.cursor); err != nil {
			return fmt.Errorf("console: sample the webhook attempts: %w", err)
		}
		h.counted = true
		return nil
	}
	var n, failed, last int64
	if err := c.cfg.Pool.QueryRow(rctx, qAttemptsSince, h.cursor, maxAttemptsPerSample).Scan(&n, &failed, &last); err != nil {
		return fmt.Errorf("console: sample the webhook attempts: %w", err)
	}
	h.attempts += n
	h.failed += failed
	h.cursor = last
	return nil
}

// historyCopy is the samples of the last hour, oldest first.
func (c *Console) historyCopy() []sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sample(nil), c.health.history...)
}
