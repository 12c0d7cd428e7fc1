package bench

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/forwarder"
)

// forwarded is how many rows the forwarders registered with g had the
// broker acknowledge (outflow_forwarder_forwarded_total, every topic): the
// moment a batch is published, where the outbox itself tells it only at
// the forwarder's next lease tick (its partitions' cursors), up to
// LeaseRenewInterval later, which would count in a rate.
func forwarded(g prometheus.Gatherer) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "outflow_forwarder_forwarded_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n, nil
}

// outboxDrained tells that no outbox row waits, parked ones included, as
// forwarder.ReadStats counts them from the partitions' cursors: seen up to
// a lease tick after the forwarder published the last row.
func outboxDrained(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	s, err := forwarder.ReadStats(ctx, pool)
	return s.Pending == 0 && s.Parked == 0, err
}

// publishThroughSQL marks the outbox's rows up to now published, as a
// forwarder records it: every partition's cursor at the newest row. It
// creates the forwarder's default 16 partitions, which the bench's
// forwarders use: run on a schema no forwarder used yet.
const publishThroughSQL = `
	WITH sets AS (INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 16))
	INSERT INTO outbox_partitions (partition, published_through, published_high, published_through_at)
	SELECT g, m.id, m.id, now() FROM generate_series(0, 15) g, (SELECT coalesce(max(id), 0) AS id FROM outbox) m`
