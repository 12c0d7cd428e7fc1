package deliveries

import (
	"context"
	"fmt"
	"time"

	"github.com/outflow-dev/outflow/webhooks"
)

// Stats are the numbers an operator watches, over every account: the
// sender's queue and the endpoints it is kept from.
type Stats struct {
	// Pending counts the deliveries not settled yet (in flight, due, or
	// waiting for a retry or a circuit's end).
	Pending int64
	// Failing counts the pending deliveries after a failed attempt: they
	// will be retried.
	Failing int64
	// Failed counts the deliveries given up (the schedule ran out, a 4xx,
	// or their endpoint was disabled): final until resent or recovered.
	Failed int64
	// EndpointsDisabled counts the endpoints disabled, by their account
	// or for failing too long.
	EndpointsDisabled int64
	// EndpointsCircuitOpen counts the endpoints whose circuit is open
	// now: nothing goes to them but a probe once it ends.
	EndpointsCircuitOpen int64
	// OldestDueAge is how long the oldest due delivery has waited past
	// its time (0: none is due): a sender that keeps up keeps it to
	// seconds.
	OldestDueAge time.Duration
}

// StatsQuery counts one thing at a time, each through a partial index:
// the pending through webhook_endpoint_deliveries_pending_idx, the oldest
// due as the first entry of either lane's due index (..._due_healthy_idx,
// ..._due_suspect_idx), the failed through ..._failed_idx, the endpoints
// through webhook_endpoints_disabled_idx and ..._circuit_idx. A count
// over `status IN (...)` or over the whole endpoints table would read
// every settled delivery, or every endpoint. Exported for the plan
// checks of its callers.
const StatsQuery = `
	SELECT (SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'pending'),
	       (SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'pending' AND attempts > 0),
	       (SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'failed'),
	       (SELECT count(*) FROM webhook_endpoints WHERE disabled_at IS NOT NULL),
	       (SELECT count(*) FROM webhook_endpoints WHERE circuit_open_until > now()),
	       coalesce(extract(epoch FROM now() - least(
	           (SELECT min(next_attempt_at) FROM webhook_endpoint_deliveries
	            WHERE status = 'pending' AND NOT suspect AND next_attempt_at <= now()),
	           (SELECT min(next_attempt_at) FROM webhook_endpoint_deliveries
	            WHERE status = 'pending' AND suspect AND next_attempt_at <= now()))), 0)::float8`

// ReadStats reads the [Stats] of every account on db.
func ReadStats(ctx context.Context, db webhooks.DB) (Stats, error) {
	var s Stats
	var age float64
	if err := db.QueryRow(ctx, StatsQuery).Scan(&s.Pending, &s.Failing, &s.Failed, &s.EndpointsDisabled,
		&s.EndpointsCircuitOpen, &age); err != nil {
		return Stats{}, fmt.Errorf("webhook stats: %w", err)
	}
	s.OldestDueAge = time.Duration(age * float64(time.Second))
	return s, nil
}
