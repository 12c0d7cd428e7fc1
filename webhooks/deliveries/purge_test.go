package deliveries_test

import (
	"sync"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
)

// count runs a count(*) query.
func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(f.ctx, sql, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) attempt(delivery int64, endpoint string) {
	f.t.Helper()
	f.exec(`INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, status_code, latency_ms, response_body)
		VALUES ($1, $2, 500, 3, 'oops')`, delivery, endpoint)
}

// Settled deliveries older than the cutoff go, in batches, with their
// attempts, and the messages left without a delivery; a pending one
// stays whatever its age, and so does a message one of whose deliveries
// is left.
func TestPurge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep1, ep2 := f.endpoint("acct"), f.endpoint("acct")
	old, recent := 48*time.Hour, time.Hour
	type c struct {
		s1, s2     string
		age1, age2 time.Duration
		gone1      bool
		gone2      bool
		msgGone    bool
	}
	cases := []c{
		{"delivered", "failed", old, old, true, true, true},
		{"delivered", "pending", old, old, true, false, false}, // its pending delivery keeps the message
		{"delivered", "delivered", recent, recent, false, false, false},
		{"failed", "delivered", old, recent, true, false, false},
		{"delivered", "delivered", old, old, true, true, true},
		{"failed", "failed", old, old, true, true, true},
		{"pending", "pending", old, old, false, false, false},
	}
	msgs := make([]string, len(cases))
	for i, cs := range cases {
		msgs[i] = f.message("acct", "payment.paid")
		f.attempt(f.set(msgs[i], ep1, cs.s1, 1, cs.age1), ep1)
		f.attempt(f.set(msgs[i], ep2, cs.s2, 1, cs.age2), ep2)
	}
	attemptsBefore := f.count(`SELECT count(*) FROM webhook_endpoint_attempts`)

	dels, ms, err := deliveries.Purge(f.ctx, f.pool, time.Now().Add(-24*time.Hour), 2)
	if err != nil {
		t.Fatal(err)
	}
	wantDels, wantMsgs := 0, 0
	for i, cs := range cases {
		for _, x := range []struct {
			ep   string
			gone bool
		}{{ep1, cs.gone1}, {ep2, cs.gone2}} {
			if x.gone {
				wantDels++
			}
			if n := f.count(`SELECT count(*) FROM webhook_endpoint_deliveries WHERE message_id = $1 AND endpoint_id = $2`,
				msgs[i], x.ep); (n == 0) != x.gone {
				t.Errorf("%+v: delivery to %s left: %d", cs, x.ep, n)
			}
		}
		if cs.msgGone {
			wantMsgs++
		}
		if n := f.count(`SELECT count(*) FROM webhook_messages WHERE id = $1`, msgs[i]); (n == 0) != cs.msgGone {
			t.Errorf("%+v: message left: %d", cs, n)
		}
	}
	if dels != wantDels || ms != wantMsgs {
		t.Fatalf("Purge = %d deliveries, %d messages; want %d, %d", dels, ms, wantDels, wantMsgs)
	}
	if got := f.count(`SELECT count(*) FROM webhook_endpoint_attempts`); got != attemptsBefore-wantDels {
		t.Fatalf("%d attempts left, want %d: the purged deliveries' go with them", got, attemptsBefore-wantDels)
	}
	if _, _, err := deliveries.Purge(f.ctx, f.pool, time.Now(), 0); err == nil {
		t.Fatal("batch 0 accepted")
	}
}

// Purges running at once, each taking one delivery at a time (so that
// two take a message's two deliveries together), leave no message
// without a delivery behind.
func TestPurgeConcurrentLeavesNoMessageBehind(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep1, ep2 := f.endpoint("acct"), f.endpoint("acct")
	const n = 150
	f.exec(`WITH m AS (
		    INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, payload)
		    SELECT gen_random_uuid(), 'acct', 'payment.paid', now(), '\x7b7d' FROM generate_series(1, $3) RETURNING id
		)
		INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, created_at, settled_at)
		SELECT m.id, e.id, 'delivered', now() - interval '2 days', now() FROM m, unnest(ARRAY[$1, $2]::uuid[]) e(id)`,
		ep1, ep2, n)
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		dels, msgs   int
		errs         []error
		cutoff       = time.Now().Add(-time.Hour)
		start        = make(chan struct{})
		concurrently = 4
	)
	for range concurrently {
		wg.Go(func() {
			<-start
			d, m, err := deliveries.Purge(f.ctx, f.pool, cutoff, 1)
			mu.Lock()
			defer mu.Unlock()
			dels, msgs = dels+d, msgs+m
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	// A purge that stopped on a batch cut short by another's locks may
	// leave some: one more, alone, finishes.
	d, m, err := deliveries.Purge(f.ctx, f.pool, cutoff, 10)
	if err != nil {
		t.Fatal(err)
	}
	dels, msgs = dels+d, msgs+m
	if left := f.count(`SELECT count(*) FROM webhook_messages`); left != 0 || dels != 2*n || msgs != n {
		t.Fatalf("%d messages left without a delivery (purged %d deliveries, %d messages; want %d, %d)",
			left, dels, msgs, 2*n, n)
	}
}

// Two purges' transactions that each delete one of a message's two
// deliveries, their statements interleaved as badly as they can be: the
// message goes all the same (the second waits for the first's lock on
// it, and then sees both deliveries gone).
func TestPurgeInterleavedLeavesNoMessageBehind(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep1, ep2 := f.endpoint("acct"), f.endpoint("acct")
	m := f.message("acct", "payment.paid")
	f.set(m, ep1, "delivered", 1, 48*time.Hour)
	f.set(m, ep2, "failed", 1, 48*time.Hour)
	cutoff := time.Now().Add(-time.Hour)

	t1, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = t1.Rollback(f.ctx) }()
	t2, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = t2.Rollback(f.ctx) }()
	var pid2 int
	if err := t2.QueryRow(f.ctx, `SELECT pg_backend_pid()`).Scan(&pid2); err != nil {
		t.Fatal(err)
	}
	if n, _, err := deliveries.PurgeDeliveries(f.ctx, t1, cutoff, 1); err != nil || n != 1 {
		t.Fatalf("first purge: %d, %v", n, err)
	}
	var (
		took, stmt2, done = make(chan struct{}), make(chan struct{}), make(chan struct{})
		go2, go3          = make(chan struct{}), make(chan struct{})
		errT2             error
	)
	go func() {
		defer close(done)
		n, ids, err := deliveries.PurgeDeliveries(f.ctx, t2, cutoff, 1)
		close(took)
		if err != nil || n != 1 {
			errT2 = err
			return
		}
		<-go2
		if _, errT2 = deliveries.PurgeMessages(f.ctx, t2, ids); errT2 != nil {
			return
		}
		close(stmt2)
		<-go3
		errT2 = t2.Commit(f.ctx)
	}()
	closed := func(c chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	outflowtest.WaitFor(t, 10*time.Second, "the second purge to take its delivery, or wait for a lock", func() bool {
		var waiting bool
		_ = f.pool.QueryRow(f.ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`,
			pid2).Scan(&waiting)
		return closed(took) || waiting
	})
	if _, err := deliveries.PurgeMessages(f.ctx, t1, []string{m}); err != nil {
		t.Fatal(err)
	}
	if closed(took) {
		// Not held back: the second's statement on the messages before
		// the first commits.
		close(go2)
		select {
		case <-stmt2:
		case <-done:
		}
		if err := t1.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		close(go3)
	} else {
		if err := t1.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		close(go2)
		close(go3)
	}
	<-done
	if errT2 != nil {
		t.Fatal(errT2)
	}
	if n := f.count(`SELECT count(*) FROM webhook_endpoint_deliveries`); n != 0 {
		t.Fatalf("%d deliveries left", n)
	}
	if n := f.count(`SELECT count(*) FROM webhook_messages`); n != 0 {
		t.Fatal("the message was left without any delivery: neither purge deleted it")
	}
}

// The WAL a purge writes per delivery (its attempts and message
// included), measured on this schema; rough: the server's other writers
// add theirs. Run with -v to see it.
func TestPurgeWAL(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ep := f.endpoint("acct")
	const n = 2000
	// A message of 300 bytes, one delivery, two attempts with a body.
	f.exec(`WITH m AS (
		    INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, payload)
		    SELECT gen_random_uuid(), 'acct', 'payment.paid', now(), convert_to(repeat('x', 300), 'UTF8')
		    FROM generate_series(1, $2) RETURNING id
		), d AS (
		    INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, created_at, settled_at)
		    SELECT m.id, $1, 'delivered', now() - interval '2 days', now() FROM m RETURNING id
		)
		INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, status_code, latency_ms, response_body)
		SELECT d.id, $1, 200, 12, '{"received":true}' FROM d, generate_series(1, 2)`, ep, n)
	// No CHECKPOINT before: the rows were just written, so their pages'
	// full images are in the WAL already, and the figure is the purge's
	// own records (a purge of pages untouched since the last checkpoint
	// writes a full image of each first).
	var before string
	if err := f.pool.QueryRow(f.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
		t.Skipf("no WAL position: %v", err)
	}
	dels, msgs, err := deliveries.Purge(f.ctx, f.pool, time.Now().Add(-time.Hour), 500)
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	if err := f.pool.QueryRow(f.ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, before).Scan(&bytes); err != nil {
		t.Fatal(err)
	}
	if dels != n || msgs != n {
		t.Fatalf("purged %d deliveries, %d messages; want %d each", dels, msgs, n)
	}
	t.Logf("purge of %d deliveries (each with its message and 2 attempts), batches of 500: %d bytes of WAL, %.0f per delivery (server-wide: other writers included)",
		n, bytes, float64(bytes)/n)
}
