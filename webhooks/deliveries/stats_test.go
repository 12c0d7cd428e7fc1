package deliveries_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/webhooks/deliveries"
)

// ReadStats counts every account's queue and endpoints: pending, failing
// (pending after an attempt), failed, endpoints disabled and with an open
// circuit (a circuit that ended is not), and how long the oldest due
// delivery has waited (a leased one's time is its lease's end: not due).
func TestReadStats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	zero, err := deliveries.ReadStats(f.ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	if zero != (deliveries.Stats{}) {
		t.Fatalf("empty tables: %+v", zero)
	}
	a, b, off, open, closed := f.endpoint("a"), f.endpoint("b"), f.endpoint("a"), f.endpoint("c"), f.endpoint("c")
	f.disable(off)
	f.exec(`UPDATE webhook_endpoints SET circuit_open_until = now() + interval '1 minute' WHERE id = $1`, open)
	f.exec(`UPDATE webhook_endpoints SET circuit_open_until = now() - interval '1 minute' WHERE id = $1`, closed)
	m1, m2, m3, m4 := f.message("a", "payment.paid"), f.message("b", "payment.paid"), f.message("a", "payment.paid"), f.message("b", "payment.paid")
	f.set(m1, a, "pending", 2, 0) // failing
	f.set(m2, b, "pending", 0, 0) // due, not tried
	f.set(m3, a, "delivered", 1, 0)
	f.set(m4, b, "failed", 9, 0)
	f.exec(`UPDATE webhook_endpoint_deliveries SET next_attempt_at = now() - interval '2 minutes' WHERE message_id = $1`, m2)
	f.exec(`UPDATE webhook_endpoint_deliveries SET next_attempt_at = now() + interval '30 seconds', lease_token = gen_random_uuid()
		WHERE message_id = $1 AND endpoint_id = $2`, m1, a)
	// m1 and m3 went to a's disabled endpoint as failed ("endpoint disabled").
	s, err := deliveries.ReadStats(f.ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.Pending != 2 || s.Failing != 1 || s.Failed != 3 || s.EndpointsDisabled != 1 || s.EndpointsCircuitOpen != 1 {
		t.Fatalf("stats: %+v", s)
	}
	if s.OldestDueAge < 110*time.Second || s.OldestDueAge > 10*time.Minute {
		t.Fatalf("oldest due: %s, want about 2 min", s.OldestDueAge)
	}
}

// Each count reads a partial index, never a table whole: not the
// deliveries settled (most of them), nor every endpoint.
func TestReadStatsUsesIndexes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	conn, err := f.pool.Acquire(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(f.ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(f.ctx, "EXPLAIN "+deliveries.StatsQuery)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	for _, want := range []string{"webhook_endpoint_deliveries_due_healthy_idx", "webhook_endpoint_deliveries_due_suspect_idx",
		"webhook_endpoint_deliveries_failing_idx",
		"webhook_endpoint_deliveries_failed_idx", "webhook_endpoints_disabled_idx", "webhook_endpoints_circuit_idx"} {
		if !strings.Contains(text, want) {
			t.Errorf("no scan of %s:\n%s", want, text)
		}
	}
	if strings.Contains(text, "Seq Scan") || strings.Contains(text, "_pkey") {
		t.Errorf("a table read whole:\n%s", text)
	}
}
