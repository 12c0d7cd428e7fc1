package sender

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/redact"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
)

// settler records results until results is closed, every result waiting
// at the time in one statement (at most 200).
func (s *Sender) settler(ctx context.Context, results <-chan settled) {
	// Settling must outlive the shutdown that ended ctx: the results of
	// requests that completed are recorded.
	ctx = context.WithoutCancel(ctx)
	for r := range results {
		batch := []settled{r}
	more:
		for len(batch) < 200 {
			select {
			case r, ok := <-results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := s.settle(sctx, batch); err != nil {
			// The deliveries stay leased; they go out again once the
			// leases lapse, their attempts unrecorded.
			s.cfg.Logger.Warn("settle webhook deliveries", "deliveries", len(batch), "error", err.Error())
		}
		cancel()
		for _, r := range batch {
			if r.holdSlot {
				s.done(r.slot)
			}
		}
	}
}

// settleSQL records a batch of attempts ($1..$13, one row each) and what
// they decide, in one statement:
//
//   - health: per endpoint, from the attempts that made a request (lease
//     lost or not: the endpoint did answer, or did not). A success in the
//     batch closes everything (a run of failures ends; the endpoint's
//     deliveries that an open circuit held back are due now); otherwise
//     the run grows by the batch's failures, failing_since is set if it
//     was not, and the circuit opens when the run reaches $14 (for $15
//     seconds doubling per further failure up to $16), or at once for a
//     429/503's Retry-After. A failure when the run began more than $17
//     seconds ago disables the endpoint. The endpoint rows are locked
//     first (ordered by id, against deadlocks between Senders) so that two
//     Senders' batches add up. A healthy endpoint's success changes
//     nothing and is neither locked nor written: a new version of the
//     endpoint per delivery was a large part of a webhook's WAL.
//   - each delivery the Sender still holds the lease of (token) while it is
//     pending gets its outcome: status, next attempt (not before the
//     circuit's end), last error; failed when its endpoint was disabled.
//   - the endpoint's hold (held_until): while its circuit is open, the
//     circuit's end; after a failed attempt to be retried, the earliest
//     such retry plus $16 seconds (CircuitCooldownMax), the longest the
//     backlog waits for the retry's outcome; none after a success.
//   - the endpoint's other pending deliveries: failed "endpoint disabled"
//     when it was disabled, due now when it answered after a circuit or a
//     hold, otherwise held to the hold's end (those due before it pushed
//     back, those an older, longer hold kept brought forward: the circuit
//     that opens ends that hold with its probe). Those it holds move to
//     the suspect lane (suspect), as do the batch's failed ones; a
//     success moves all of them back.
//   - every attempt is recorded, lease_lost when nothing was applied (by
//     token: a batch can hold the late result of a lapsed lease beside
//     the result of the Sender's own next lease of the same delivery),
//     except that of a delivery no longer there (deleted by retention or
//     with its endpoint), which would fail the whole statement on the
//     foreign key: live locks the deliveries against that (FOR KEY SHARE,
//     as the foreign key check would).
//
// It returns the attempts recorded ('a', delivery id, lease lost), the
// endpoints it disabled ('d', ...), for their notices, and those whose
// circuit it opened ('c').
const settleSQL = `
WITH r AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::uuid[], $4::text[], $5::float8[], $6::text[], $7::int[],
                         $8::float8[], $9::text[], $10::text[], $11::bool[], $12::bool[], $13::float8[])
        AS r(id, token, endpoint_id, status, delay, last_error, code, latency_ms, error, body, sent, ok, open_secs)
), agg AS (
    SELECT endpoint_id, bool_or(ok) AS any_ok, count(*) FILTER (WHERE NOT ok) AS fails, max(open_secs) AS open_secs,
           (array_agg(last_error) FILTER (WHERE NOT ok))[1] AS last_error,
           min(delay) FILTER (WHERE NOT ok AND status = 'pending') AS retry_secs
    FROM r WHERE sent GROUP BY endpoint_id
), locked AS (
    SELECT e.id, e.account_id, e.url, e.consecutive_failures, e.failing_since, e.circuit_open_until, e.held_until
    FROM webhook_endpoints e JOIN agg a ON a.endpoint_id = e.id
    WHERE e.disabled_at IS NULL
      AND (NOT a.any_ok OR e.consecutive_failures <> 0 OR e.failing_since IS NOT NULL
           OR e.circuit_open_until IS NOT NULL OR e.held_until IS NOT NULL)
    ORDER BY e.id
    FOR NO KEY UPDATE OF e
), h0 AS (
    SELECT l.id, l.account_id, l.url, a.any_ok, a.last_error, a.retry_secs, l.held_until AS old_hold,
           l.circuit_open_until IS NOT NULL OR l.held_until IS NOT NULL AS was_open, l.circuit_open_until AS old_circuit,
           CASE WHEN a.any_ok THEN 0 ELSE l.consecutive_failures + a.fails END AS failures,
           CASE WHEN a.any_ok THEN NULL ELSE coalesce(l.failing_since, now()) END AS failing_since,
           CASE WHEN a.any_ok THEN NULL
                WHEN a.open_secs IS NOT NULL
                    THEN greatest(l.circuit_open_until, now() + make_interval(secs => a.open_secs))
                WHEN l.consecutive_failures + a.fails >= $14
                    THEN now() + make_interval(secs => least($16::float8,
                         $15::float8 * power(2, least(l.consecutive_failures + a.fails - $14, 30))))
                ELSE l.circuit_open_until END AS circuit,
           NOT a.any_ok AND l.failing_since < now() - make_interval(secs => $17) AS disable
    FROM locked l JOIN agg a ON a.endpoint_id = l.id
), h AS (
    SELECT h0.*,
           CASE WHEN h0.any_ok THEN NULL
                WHEN h0.circuit > now() THEN h0.circuit
                WHEN h0.retry_secs IS NOT NULL
                    THEN greatest(h0.old_hold, now() + make_interval(secs => h0.retry_secs + $16::float8))
                ELSE h0.old_hold END AS hold
    FROM h0
), eupd AS (
    UPDATE webhook_endpoints e
    SET consecutive_failures = h.failures, failing_since = h.failing_since, circuit_open_until = h.circuit,
        held_until = CASE WHEN h.disable THEN NULL ELSE h.hold END,
        disabled_at = CASE WHEN h.disable THEN now() END,
        disabled_reason = CASE WHEN h.disable THEN 'failing' END
    FROM h WHERE e.id = h.id
    RETURNING e.id
), live AS (
    SELECT d.id FROM webhook_endpoint_deliveries d WHERE d.id IN (SELECT id FROM r) FOR KEY SHARE
), upd AS (
    UPDATE webhook_endpoint_deliveries d
    SET status = CASE WHEN h.disable THEN 'failed' ELSE r.status END,
        attempts = d.attempts + 1, lease_token = NULL,
        next_attempt_at = greatest(now() + make_interval(secs => r.delay), h.circuit),
        suspect = coalesce(NOT h.any_ok, d.suspect),
        last_error = CASE WHEN h.disable THEN 'endpoint disabled' ELSE r.last_error END,
        settled_at = CASE WHEN h.disable OR r.status <> 'pending' THEN now() END
    FROM r LEFT JOIN h ON h.id = r.endpoint_id
    WHERE d.id = r.id AND d.lease_token = r.token AND d.status = 'pending'
    RETURNING d.id, r.token
), others AS (
    UPDATE webhook_endpoint_deliveries d
    SET status = CASE WHEN h.disable THEN 'failed' ELSE d.status END,
        last_error = CASE WHEN h.disable THEN 'endpoint disabled' ELSE d.last_error END,
        settled_at = CASE WHEN h.disable THEN now() END,
        lease_token = CASE WHEN h.disable THEN NULL ELSE d.lease_token END,
        next_attempt_at = CASE WHEN h.disable THEN d.next_attempt_at
                               WHEN h.any_ok AND h.was_open AND d.lease_token IS NULL AND d.next_attempt_at > now()
                                   THEN now()
                               WHEN h.any_ok THEN d.next_attempt_at
                               ELSE h.hold END,
        suspect = CASE WHEN h.disable THEN d.suspect ELSE NOT h.any_ok END
    FROM h
    WHERE d.endpoint_id = h.id AND d.status = 'pending' AND d.id NOT IN (SELECT id FROM r)
      AND (h.disable
           OR (h.any_ok AND h.was_open AND d.lease_token IS NULL AND d.next_attempt_at > now())
           OR (h.any_ok AND d.suspect)
           OR (NOT h.any_ok AND h.hold > now() AND d.next_attempt_at < h.hold)
           OR (NOT h.any_ok AND h.hold > now() AND h.old_hold > h.hold AND d.lease_token IS NULL
               AND d.next_attempt_at > h.hold AND d.next_attempt_at <= h.old_hold))
    RETURNING d.id
), ins AS (
    INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, status_code, latency_ms, error, response_body, lease_lost)
    SELECT r.id, r.endpoint_id, r.code, r.latency_ms, r.error, r.body,
           NOT EXISTS (SELECT 1 FROM upd WHERE upd.id = r.id AND upd.token = r.token)
    FROM r JOIN live USING (id)
    RETURNING delivery_id, lease_lost
)
SELECT 'a', delivery_id, lease_lost, NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text
FROM ins
UNION ALL
SELECT 'd', NULL, NULL, h.id::text, h.account_id, h.url, h.failing_since, h.last_error
FROM h WHERE h.disable AND h.id IN (SELECT id FROM eupd)
UNION ALL
SELECT 'c', NULL, NULL, h.id::text, NULL, NULL, NULL, NULL
FROM h WHERE NOT h.disable AND h.circuit > now() AND h.circuit IS DISTINCT FROM h.old_circuit`

// disabledEndpoint is an endpoint a settle disabled.
type disabledEndpoint struct {
	id, account, url, lastError string
	failingSince                time.Time
}

func (s *Sender) settle(ctx context.Context, batch []settled) error {
	n := len(batch)
	var (
		ids       = make([]int64, n)
		tokens    = make([]string, n)
		endpoints = make([]string, n)
		statuses  = make([]string, n)
		delays    = make([]float64, n)
		lastErrs  = make([]*string, n)
		codes     = make([]*int, n)
		lats      = make([]float64, n)
		errs      = make([]*string, n)
		bodies    = make([]*string, n)
		sent      = make([]bool, n)
		oks       = make([]bool, n)
		opens     = make([]*float64, n)
	)
	for i, r := range batch {
		ids[i], tokens[i], endpoints[i], statuses[i] = r.d.ID, r.d.LeaseToken, r.d.EndpointID, r.status
		delays[i] = r.delay.Seconds()
		lats[i] = float64(r.a.latency.Microseconds()) / 1000
		if r.status != "delivered" {
			e := truncate(outcome(r.a), 2000)
			lastErrs[i] = &e
		}
		if r.a.err != nil {
			e := truncate(r.a.err.Error(), 2000)
			errs[i] = &e
		}
		if r.a.code != 0 {
			codes[i] = &r.a.code
		}
		bodies[i], sent[i], oks[i] = r.a.body, r.a.sent, r.status == "delivered"
		if r.openFor > 0 {
			o := r.openFor.Seconds()
			opens[i] = &o
		}
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("settle webhook deliveries: %w", err)
	}
	defer conn.Release()
	lost := map[int64]bool{}
	var disabled []disabledEndpoint
	opened := 0
	// A transaction whose commit does not wait for its WAL flush (see
	// unflushed), left open for the notices of the endpoints it disabled.
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	b.Queue(settleSQL, ids, tokens, endpoints, statuses, delays, lastErrs, codes, lats, errs, bodies, sent, oks, opens,
		s.cfg.CircuitFailures, s.cfg.CircuitCooldown.Seconds(), s.cfg.CircuitCooldownMax.Seconds(),
		s.cfg.DisableAfter.Seconds()).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var kind string
			var id *int64
			var l *bool
			var eid, acct, url, lastErr *string
			var since *time.Time
			if err := rows.Scan(&kind, &id, &l, &eid, &acct, &url, &since, &lastErr); err != nil {
				return err
			}
			switch kind {
			case "a":
				if *l {
					lost[*id] = true
				}
			case "d":
				d := disabledEndpoint{id: *eid, account: *acct, url: *url, failingSince: *since}
				if lastErr != nil {
					d.lastError = *lastErr
				}
				disabled = append(disabled, d)
			case "c":
				opened++
			}
		}
		return rows.Err()
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		rollback(conn)
		return fmt.Errorf("settle webhook deliveries: %w", err)
	}
	for _, d := range disabled {
		if err := s.notifyDisabled(ctx, conn, d); err != nil {
			rollback(conn)
			return err
		}
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		rollback(conn)
		return fmt.Errorf("settle webhook deliveries: commit: %w", err)
	}
	for _, r := range batch {
		s.metrics.count(r, lost[r.d.ID])
		switch {
		case lost[r.d.ID]:
			s.cfg.Logger.Warn("webhook delivery lease lost before its result was recorded", "message_id", r.d.MessageID,
				"endpoint_id", r.d.EndpointID, "result", outcome(r.a))
		case r.status == "failed" && r.a.detail != nil:
			s.cfg.Logger.Warn("webhook delivery failed", "message_id", r.d.MessageID, "endpoint_id", r.d.EndpointID,
				"attempts", r.attempts, "last", outcome(r.a), "detail", r.a.detail.Error())
		case r.status == "failed":
			s.cfg.Logger.Warn("webhook delivery failed", "message_id", r.d.MessageID, "endpoint_id", r.d.EndpointID,
				"attempts", r.attempts, "last", outcome(r.a))
		}
	}
	s.metrics.endpoints(opened, len(disabled))
	for _, d := range disabled {
		s.cfg.Logger.Warn("webhook endpoint disabled: failing for too long", "endpoint_id", d.id, "account_id", d.account,
			"failing_since", d.failingSince)
	}
	if len(disabled) > 0 {
		s.Wake() // the notices are due now
	}
	return nil
}

// notifyDisabled enqueues, in the settle's transaction, the
// endpoint.disabled notice to the account's other endpoints.
func (s *Sender) notifyDisabled(ctx context.Context, db webhooks.DB, d disabledEndpoint) error {
	payload, err := json.Marshal(webhooks.EndpointDisabled{EndpointID: d.id, URL: redact.URL(d.url),
		FailingSince: d.failingSince.UTC(), DisabledAt: time.Now().UTC(), LastError: d.lastError})
	if err != nil {
		return fmt.Errorf("endpoint.disabled notice for %s: %w", d.id, err)
	}
	m := webhooks.Message{ID: uuid.NewString(), AccountID: d.account, EventType: webhooks.EventEndpointDisabled,
		OccurredAt: time.Now(), SchemaVersion: 1, Payload: payload}
	if _, err := fanout.Enqueue(ctx, db, m, fanout.Target{Except: d.id, AllTypes: true}, ""); err != nil {
		return fmt.Errorf("endpoint.disabled notice for %s: %w", d.id, err)
	}
	return nil
}

// rollback ends a failed settle's transaction, bounded: the connection
// goes back to the pool either way (pgx closes one left in a transaction).
func rollback(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		// Unknown state: closed rather than handed to another user.
		_ = conn.Conn().Close(ctx)
	}
}

// unflushed runs one statement in a transaction of its own whose commit
// does not wait for its WAL flush, in one round trip; fn reads its rows. A
// lease or a settle that a PostgreSQL crash forgets means the webhook is
// sent again (a duplicate, which the endpoint may get anyway), never lost;
// waiting for the flush of each would cost a disk sync per webhook, twice.
func (s *Sender) unflushed(ctx context.Context, sql string, args []any, fn func(pgx.Rows) error) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	b.Queue(sql, args...).Query(fn)
	b.Queue("COMMIT")
	return s.pool.SendBatch(ctx, b).Close()
}
