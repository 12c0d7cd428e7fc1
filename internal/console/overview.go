package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

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
}

// readOverview reads the overview's numbers: every query reads pending or
// open rows through their partial indexes, or small tables. The reads are
// independent, so they run at once, each on a connection of its own: the
// overview takes as long as its slowest read, not the sum of them (issue
// 16 asks for 100 ms).
func (c *Console) readOverview(ctx context.Context) (overview, error) {
	var (
		o      overview
		parked map[string]idempotency.ParkedCounts
		lags   = make([]string, len(c.cfg.Consumers))
	)
	// The total is stamped when its read starts: a sample the rate's
	// sampler takes while a slow read runs is then newer, and the ring keeps
	// its samples in time order (see rateRing.add).
	o.At = c.now()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		o.Outbox, err = forwarder.ReadStats(gctx, c.cfg.Pool)
		return err
	})
	if !c.cfg.FrameworkOnly {
		g.Go(func() error {
			w, err := handlers.ReadWebhookStats(gctx, c.cfg.Pool)
			o.Webhooks = &w
			return err
		})
	}
	g.Go(func() error {
		// The lease's last renewal is not stored: the owner's heartbeat (it
		// renews its leases on the same tick) and the lease's end say it.
		rows, err := c.cfg.Pool.Query(gctx, `
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
	g.Go(func() (err error) {
		parked, err = idempotency.ReadParkedCounts(gctx, c.cfg.Pool)
		return err
	})
	// The broker's lags one after the other, as every other caller of a
	// brokers.LagReporter asks them (the interface promises nothing of
	// concurrent calls), beside the database's reads. A lag the broker
	// cannot tell is shown unknown, not an error: the rest of the overview
	// is still worth showing.
	g.Go(func() error {
		for i, cs := range c.cfg.Consumers {
			lags[i] = "n/a"
			if c.cfg.Lag == nil {
				continue
			}
			lag, err := c.cfg.Lag.Lag(gctx, cs.Name, cs.Topic)
			if err != nil {
				c.log.Warn("console: consumer lag unknown", "consumer", cs.Name, "error", err.Error())
				continue
			}
			lags[i] = strconv.FormatInt(lag.Events, 10)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return o, err
	}
	o.Rate = c.rate(o.Outbox.PublishedTotal, o.At)
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
	return o, nil
}

func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request, s session) {
	o, err := c.readOverview(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	p := c.pageFor(s, "Overview")
	p.Data = o
	c.render(w, http.StatusOK, "overview", p)
}

// overviewFragment is the overview's live part, which console.js swaps in.
func (c *Console) overviewFragment(w http.ResponseWriter, r *http.Request, s session) {
	o, err := c.readOverview(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.pages["overview"].ExecuteTemplate(w, "overview-body", o); err != nil {
		c.log.Error("console: render fragment", "error", err.Error())
	}
}
