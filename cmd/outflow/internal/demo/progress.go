package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outflow-dev/outflow/internal/poll"
)

// counts is how far this run's events have gone through the pipeline.
type counts struct {
	written, forwarded, parked int64
	analytics, notify          int64 // processed by sync-analytics, notify-merchant
	webhooks                   int64 // paid and refunded events: one webhook each
	lag                        time.Duration
}

func readCounts(ctx context.Context, cfg Config, since time.Time) (counts, error) {
	var c counts
	var lag float64
	// Only this run's messages count: handled once the consumer's version
	// of the aggregate reached them, joined on the versions' primary key.
	// Published and parked are the forwarder's state of the rows
	// (outbox_state): a row reads published once its partition's cursor
	// passed it, which the forwarder records at its lease ticks, so the
	// lag (the oldest row not yet read published) is an upper bound, up to
	// a lease tick above the real one.
	err := cfg.Pool.QueryRow(ctx, `
		WITH run AS (SELECT o.message_id, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.created_at,
		                    s.published, s.parked_at
		             FROM outbox o JOIN outbox_state s USING (id) WHERE o.created_at >= $1),
		handled AS (
		    SELECT v.consumer FROM run JOIN consumer_aggregate_versions v
		    ON v.consumer IN ('sync-analytics', 'notify-merchant') AND v.aggregate_type = run.aggregate_type
		       AND v.aggregate_id = run.aggregate_id AND v.version >= run.aggregate_version)
		SELECT count(*), count(*) FILTER (WHERE published), count(parked_at),
		       (SELECT count(*) FROM handled WHERE consumer = 'sync-analytics'),
		       (SELECT count(*) FROM handled WHERE consumer = 'notify-merchant'),
		       count(*) FILTER (WHERE event_type IN ('payment.paid', 'payment.refunded')),
		       -- now() is this statement's start, which can precede the
		       -- created_at of a row committed while it began: clamp at 0.
		       greatest(coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE NOT published)), 0), 0)::float8
		FROM run`, since).Scan(&c.written, &c.forwarded, &c.parked, &c.analytics, &c.notify, &c.webhooks, &lag)
	if err != nil {
		return c, fmt.Errorf("read pipeline progress: %w", err)
	}
	c.lag = time.Duration(lag * float64(time.Second))
	return c, nil
}

// progress prints, every second, what this run has written to the outbox,
// what the forwarder published, what the SyncAnalytics consumer handled and
// the age of the oldest row not yet seen published: an upper bound of the
// forwarding lag, since a row is seen published from the forwarder's lease
// tick after it published it. The returned function stops it.
func progress(ctx context.Context, cfg Config, since time.Time) func() {
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			c, err := readCounts(pctx, cfg, since)
			if err != nil {
				continue // the report at the end says what matters
			}
			fmt.Fprintf(cfg.Out, "  written %6d   forwarded %6d   handled (sync-analytics) %6d   lag (at most, cursor) %5.0f ms\n",
				c.written, c.forwarded, c.analytics, float64(c.lag)/float64(time.Millisecond))
		}
	})
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}

// waitDrained waits until the deadline for every event of the run to be
// forwarded and, with Consumers, handled by both consumers and received as a
// webhook. It does not judge: the report checks what arrived, and how.
func waitDrained(ctx context.Context, cfg Config, since, deadline time.Time, rcv *receiver) error {
	err := poll.Until(ctx, 200*time.Millisecond, time.Until(deadline), func() (bool, error) {
		c, err := readCounts(ctx, cfg, since)
		ids, _, _ := rcv.counts()
		done := c.forwarded+c.parked == c.written
		if cfg.Consumers {
			done = done && c.analytics == c.written && c.notify == c.written && int64(ids) >= c.webhooks
		}
		return done, err
	})
	if errors.Is(err, poll.ErrTimeout) {
		return nil
	}
	return err
}
