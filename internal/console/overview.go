package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/idempotency"
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
	Lag         string
	idempotency.ParkedCounts
}

type overview struct {
	Outbox     forwarder.Stats
	Rate       string
	Partitions []partitionRow
	Consumers  []consumerRow
	Webhooks   *handlers.WebhookStats // nil: the app's tables are not installed (FrameworkOnly)
	At         time.Time
	// Unavailable names the panels ("outbox", "webhooks", "consumers",
	// "partitions") whose read failed or did not end within ReadTimeout,
	// with why: the page shows them so and the rest as read.
	Unavailable map[string]string
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
		parked map[string]idempotency.ParkedCounts
		lags   = make([]string, len(c.cfg.Consumers))
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
	if !c.cfg.FrameworkOnly {
		panel("webhooks", func(ctx context.Context) error {
			w, err := handlers.ReadWebhookStats(ctx, c.cfg.Pool)
			o.Webhooks = &w
			return err
		})
	}
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
		parked, err = idempotency.ReadParkedCounts(ctx, c.cfg.Pool)
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
			lags[i] = "n/a"
			if c.cfg.Lag == nil || lctx.Err() != nil {
				continue
			}
			lag, err := c.cfg.Lag.Lag(lctx, cs.Name, cs.Topic)
			if err != nil {
				c.log.Warn("console: consumer lag unknown", "consumer", cs.Name, "error", err.Error())
				continue
			}
			lags[i] = strconv.FormatInt(lag.Events, 10)
		}
	})
	wg.Wait()
	if _, ok := o.Unavailable["outbox"]; !ok {
		o.Rate = c.rate(o.Outbox.PublishedTotal, o.At)
	}
	seen := map[string]bool{}
	for i, cs := range c.cfg.Consumers {
		seen[cs.Name] = true
		o.Consumers = append(o.Consumers, consumerRow{Name: cs.Name, Topic: cs.Topic, Lag: lags[i], ParkedCounts: parked[cs.Name]})
	}
	var others []string
	for name := range parked {
		if !seen[name] {
			others = append(others, name)
		}
	}
	slices.Sort(others)
	for _, name := range others {
		o.Consumers = append(o.Consumers, consumerRow{Name: name, Lag: "n/a", ParkedCounts: parked[name]})
	}
	return o
}

func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request, s session) {
	o := c.readOverview(r.Context())
	p := c.pageFor(s, "Overview")
	p.Data = o
	c.render(w, http.StatusOK, "overview", p)
}

// overviewFragment is the overview's live part, which console.js swaps in.
func (c *Console) overviewFragment(w http.ResponseWriter, r *http.Request, s session) {
	o := c.readOverview(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.pages["overview"].ExecuteTemplate(w, "overview-body", o); err != nil {
		c.log.Error("console: render fragment", "error", err.Error())
	}
}
