package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/healthrules"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
)

type partitionRow struct {
	Partition      int32
	Owner          string
	LeaseUntil     *time.Time
	OwnerHeartbeat *time.Time
	PublishedTotal int64
}

type consumerRow struct {
	Name, Topic string
	lag         *brokers.Lag // nil: unknown
	idempotency.DeadLetterCounts
}

// Lag is the consumer's lag as a person reads it: "1,234 events, oldest
// 3 min", "0", or "n/a" when the broker could not tell.
func (r consumerRow) Lag() string {
	switch {
	case r.lag == nil:
		return "n/a"
	case r.lag.Events == 0:
		return "0"
	case r.lag.OldestAge > 0:
		return fmt.Sprintf("%s events, oldest %s", thousands(r.lag.Events), coarse(r.lag.OldestAge))
	}
	return thousands(r.lag.Events) + " events" // the broker does not tell the age (amqp)
}

// Lagging: the consumer's lag is over a health rule's threshold.
func (r consumerRow) Lagging() bool {
	return r.lag != nil && (float64(r.lag.Events) > healthrules.ConsumerBacklog.Threshold ||
		r.lag.OldestAge.Seconds() > healthrules.ConsumerLagging.Threshold)
}

type overview struct {
	Outbox     forwarder.Stats
	Rate       string
	Partitions []partitionRow
	Consumers  []consumerRow
	// Webhooks are the framework's webhook tables' counts; nil: the
	// webhooks migration set is not installed.
	Webhooks *deliveries.Stats
	At       time.Time
	// Unavailable names the panels ("outbox", "webhooks", "consumers",
	// "partitions") whose read failed or did not end within ReadTimeout,
	// with why: the page shows them so and the rest as read.
	Unavailable map[string]string

	// What the page adds to the reads (decorate): the status line, the
	// charts and the partitions' summary.
	Status         statusLine
	Charts         []chart
	PartitionsFold partitionsSummary
}

// readOverview reads the overview's numbers: every query reads pending or
// open rows through their partial indexes, or small tables. The reads are
// independent, so they run at once, each on a connection of its own: the
// overview takes as long as its slowest read, not the sum of them (issue
// 16 asks for 100 ms). Each is bounded by ReadTimeout, and one that fails
// makes its panel unavailable, not the page: a lock on one table leaves
// the others' numbers on screen.
func (c *Console) readOverview(ctx context.Context) overview {
	var (
		o      = overview{Unavailable: map[string]string{}}
		parked map[string]idempotency.DeadLetterCounts
		lags   = make([]*brokers.Lag, len(c.cfg.Consumers))
		mu     sync.Mutex
		wg     sync.WaitGroup
	)
	// The total is stamped when its read starts: a sample the rate's
	// sampler takes while a slow read runs is then newer, and the ring keeps
	// its samples in time order (see rateRing.add).
	o.At = c.now()
	panel := func(name string, read func(ctx context.Context) error) {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, c.cfg.ReadTimeout)
			defer cancel()
			if err := read(rctx); err != nil {
				why := "the read failed (logged)"
				if rctx.Err() != nil {
					why = fmt.Sprintf("the database did not answer within %s", c.cfg.ReadTimeout)
				}
				c.log.Warn("console: overview panel unavailable", "panel", name, "error", err.Error())
				mu.Lock()
				o.Unavailable[name] = why
				mu.Unlock()
			}
		})
	}
	panel("outbox", func(ctx context.Context) (err error) {
		o.Outbox, err = forwarder.ReadStats(ctx, c.cfg.Pool)
		return err
	})
	panel("webhooks", func(ctx context.Context) error {
		// Any service's, FrameworkOnly or not: the tables say.
		ok, err := c.webhooksInstalled(ctx)
		if err != nil || !ok {
			return err
		}
		w, err := deliveries.ReadStats(ctx, c.cfg.Pool)
		o.Webhooks = &w
		return err
	})
	panel("partitions", func(ctx context.Context) error {
		// The lease's last renewal is not stored: the owner's heartbeat (it
		// renews its leases on the same tick) and the lease's end say it.
		rows, err := c.cfg.Pool.Query(ctx, `
			SELECT p.partition, coalesce(p.owner, ''), p.lease_until, f.heartbeat_at, p.published_total
			FROM outbox_partitions p LEFT JOIN outbox_forwarders f ON f.id = p.owner ORDER BY p.partition`)
		if err != nil {
			return fmt.Errorf("read partitions: %w", err)
		}
		if o.Partitions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[partitionRow]); err != nil {
			return fmt.Errorf("read partitions: %w", err)
		}
		return nil
	})
	panel("consumers", func(ctx context.Context) (err error) {
		parked, err = idempotency.ReadDeadLetterCounts(ctx, c.cfg.Pool)
		return err
	})
	// The broker's lags one after the other, as every other caller of a
	// brokers.LagReporter asks them (the interface promises nothing of
	// concurrent calls), beside the database's reads. A lag the broker
	// cannot tell is shown unknown, not an error: the rest of the overview
	// is still worth showing.
	wg.Go(func() {
		lctx, cancel := context.WithTimeout(ctx, c.cfg.ReadTimeout)
		defer cancel()
		for i, cs := range c.cfg.Consumers {
			if c.cfg.Lag == nil || lctx.Err() != nil {
				continue
			}
			lag, err := c.cfg.Lag.Lag(lctx, cs.Name, cs.Topic)
			if err != nil {
				c.log.Warn("console: consumer lag unknown", "consumer", cs.Name, "error", err.Error())
				continue
			}
			lags[i] = &lag
		}
	})
	wg.Wait()
	seen := map[string]bool{}
	for i, cs := range c.cfg.Consumers {
		seen[cs.Name] = true
		o.Consumers = append(o.Consumers, consumerRow{Name: cs.Name, Topic: cs.Topic, lag: lags[i], DeadLetterCounts: parked[cs.Name]})
	}
	var others []string
	for name := range parked {
		if !seen[name] {
			others = append(others, name)
		}
	}
	slices.Sort(others)
	for _, name := range others {
		o.Consumers = append(o.Consumers, consumerRow{Name: name, DeadLetterCounts: parked[name]})
	}
	return o
}

// readPage is the overview as a page shows it: its reads, the published
// rate up to them, the status line by the health rules over the last
// hour's samples and this read, the charts and the partitions' summary.
func (c *Console) readPage(ctx context.Context) overview {
	o := c.readOverview(ctx)
	if _, ok := o.Unavailable["outbox"]; !ok {
		o.Rate = c.rate(o.Outbox.PublishedTotal, o.At)
	}
	history := c.historyCopy()
	snaps := make([]healthrules.Snapshot, 0, len(history)+1)
	for _, s := range history {
		if !s.snap.At.After(o.At) {
			snaps = append(snaps, s.snap)
		}
	}
	now := c.snapshot(o)
	// The attempts are counted by the sampler only: the newest sample's
	// counts stand for now.
	if now.Webhooks != nil && len(snaps) > 0 {
		if prev := snaps[len(snaps)-1].Webhooks; prev != nil {
			now.Webhooks.Attempts, now.Webhooks.FailedAttempts, now.Webhooks.AttemptsKnown = prev.Attempts, prev.FailedAttempts, prev.AttemptsKnown
		}
	}
	o.Status = c.statusLine(healthrules.Evaluate(append(snaps, now)), o.Unavailable)
	o.Charts = c.cachedCharts(history, o.At)
	o.PartitionsFold = summarizePartitions(o.Partitions, o.At)
	return o
}

func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request, s session) {
	o := c.readPage(r.Context())
	p := c.pageFor(s, "Overview")
	p.Data = o
	c.render(w, http.StatusOK, "overview", p)
}

// overviewFragment is the overview's live part, which console.js swaps in.
func (c *Console) overviewFragment(w http.ResponseWriter, r *http.Request, s session) {
	o := c.readPage(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.pages["overview"].ExecuteTemplate(w, "overview-body", o); err != nil {
		c.log.Error("console: render fragment", "error", err.Error())
	}
}

// partitionsSummary is the one line the partition table is folded behind.
type partitionsSummary struct {
	Text string
	// Attention: a lease ran out without its holder renewing it, or a
	// partition has no holder: its rows are not being published.
	Attention bool
}

// summarizePartitions says how the partitions are held and how the
// published events spread over them: "16 partitions: 16 leased by 2
// forwarders, 1 with all 120,000 published; none stale".
func summarizePartitions(ps []partitionRow, now time.Time) partitionsSummary {
	if len(ps) == 0 {
		return partitionsSummary{Text: "No partition yet (no forwarder has run)."}
	}
	var (
		leased, stale, ownerless, withEvents int
		total                                int64
		owners                               = map[string]bool{}
	)
	for _, p := range ps {
		switch {
		case p.Owner == "":
			ownerless++
		case p.LeaseUntil != nil && p.LeaseUntil.Before(now):
			stale++
		default:
			leased++
			owners[p.Owner] = true
		}
		if p.PublishedTotal > 0 {
			withEvents++
			total += p.PublishedTotal
		}
	}
	text := fmt.Sprintf("%s: %s leased by %s", plural(int64(len(ps)), "partition", "partitions"), thousands(int64(leased)),
		plural(int64(len(owners)), "forwarder", "forwarders"))
	switch {
	case total == 0:
		text += ", none published yet"
	case withEvents == 1:
		text += fmt.Sprintf(", 1 with all %s published", thousands(total))
	default:
		text += fmt.Sprintf(", %d sharing %s published", withEvents, thousands(total))
	}
	var trouble []string
	if stale > 0 {
		trouble = append(trouble, plural(int64(stale), "stale lease (run out, not renewed)", "stale leases (run out, not renewed)"))
	}
	if ownerless > 0 {
		trouble = append(trouble, plural(int64(ownerless), "without a holder", "without a holder"))
	}
	if len(trouble) == 0 {
		return partitionsSummary{Text: text + "; none stale"}
	}
	return partitionsSummary{Text: text + "; " + strings.Join(trouble, ", "), Attention: true}
}
