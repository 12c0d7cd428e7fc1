package sender_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/webhooks/sender"
)

// With the suspect lane full, a lease reads the healthy lane only: the
// failing endpoints' due retries, older and many, are not walked to find
// the healthy deliveries behind them.
func TestLeaseSkipsTheSuspectLaneWhenFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for range 50 {
		e.endpoint(ep{account: "failing", url: "http://127.0.0.1:1/", failures: 1})
	}
	e.endpoint(ep{account: "ok", url: "http://127.0.0.1:1/"})
	e.enqueue("failing", "x", 10) // 500 due retries of the failing endpoints, in the suspect lane
	e.exec(`UPDATE webhook_endpoint_deliveries SET next_attempt_at = now() - interval '1 minute'`)
	e.enqueue("ok", "x", 5)
	// A history of settled deliveries, and statistics: plans as on a
	// table in use, where rows are looked up by key.
	e.exec(`WITH m AS (
		INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, payload)
		SELECT gen_random_uuid(), 'ok', 'x', now(), '{}' FROM generate_series(1, 20000) RETURNING id)
		INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, attempts, settled_at)
		SELECT m.id, (SELECT id FROM webhook_endpoints WHERE account_id = 'ok'), 'delivered', 1, now() FROM m`)
	e.exec(`ANALYZE webhook_endpoints, webhook_endpoint_deliveries, webhook_messages`)
	if n := e.intQ(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE suspect`); n != 500 {
		t.Fatalf("%d deliveries in the suspect lane, want 500", n)
	}
	read := func(suspectFree int) (leased, scanned int) {
		tx, err := e.s.Pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background()) //nolint:errcheck // leases nothing for good
		var plan []map[string]any
		if err := tx.QueryRow(context.Background(), `EXPLAIN (ANALYZE, FORMAT JSON) `+sender.LeaseSQL,
			64, 15.0, []string{}, []int32{}, 4, 256, []string{}, []int32{}, suspectFree, 5, []string{}).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		root := plan[0]["Plan"].(map[string]any)
		return int(root["Actual Rows"].(float64)), rowsScanned(root, "webhook_endpoint_deliveries")
	}
	// The healthy endpoint's 5 are cut to its bound, 4.
	if leased, scanned := read(0); leased != 4 || scanned > 100 {
		t.Errorf("lane full: leased %d (want 4 healthy), read %d rows of the queue (want the healthy ones, not the 500 waiting)", leased, scanned)
	}
	if leased, _ := read(16); leased != 4+16 {
		t.Errorf("lane with 16 slots free: leased %d, want 20", leased)
	}
}

// rowsScanned adds up what the plan's scans of table read to find the
// candidates: the rows each returned and those its filter removed, over
// all its loops, but for look-ups by key.
func rowsScanned(node map[string]any, table string) int {
	typ, _ := node["Node Type"].(string)
	n := 0
	idx, _ := node["Index Name"].(string)
	if node["Relation Name"] == table && strings.HasSuffix(typ, "Scan") && !strings.HasSuffix(idx, "_pkey") {
		loops, _ := node["Actual Loops"].(float64)
		rows, _ := node["Actual Rows"].(float64)
		removed, _ := node["Rows Removed by Filter"].(float64)
		n += int((rows + removed) * max(loops, 1))
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			n += rowsScanned(k.(map[string]any), table)
		}
	}
	return n
}

// A delivery another Sender holds is skipped, and the lease says it picked
// more than it took: the Sender goes round again at once rather than wait
// for a wake or the poll.
func TestLeaseSaysWhatAnotherSenderTook(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.endpoint(ep{account: "a", url: "http://127.0.0.1:1/"})
	e.endpoint(ep{account: "b", url: "http://127.0.0.1:1/"})
	e.enqueue("a", "x", 1)
	e.enqueue("b", "x", 1)
	ctx := context.Background()
	other, err := e.s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck // only held
	if _, err := other.Exec(ctx, `SELECT id FROM webhook_endpoint_deliveries ORDER BY id LIMIT 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	rows, err := e.s.Pool.Query(ctx, sender.LeaseSQL,
		64, 15.0, []string{}, []int32{}, 4, 256, []string{}, []int32{}, 16, 5, []string{})
	if err != nil {
		t.Fatal(err)
	}
	var leased, picked int
	for rows.Next() {
		leased++
		v, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		picked = int(v[len(v)-1].(int64))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if leased != 1 || picked != 2 {
		t.Fatalf("leased %d of %d picked, want 1 of 2", leased, picked)
	}
}
