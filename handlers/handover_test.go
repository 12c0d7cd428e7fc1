package handlers_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
)

// handOverPipeline is a schema with the app's sets (so each merchant has
// its endpoint, app migration 00034) and the app's service; no broker.
func handOverPipeline(t *testing.T) *pipeline {
	t.Helper()
	p := &pipeline{schema: outflowtest.NewSchema(t, appmigrations.Sets()...)}
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	p.svc, err = app.NewService(app.Config{Pool: p.schema.Pool, Events: w, AllowPrivateWebhooks: true})
	require.NoError(t, err)
	return p
}

// legacy is a webhook_deliveries row as an earlier release left it.
type legacy struct {
	status      string
	attempts    int
	next        string // SQL interval from now of next_attempt_at
	leased      bool
	lastError   *string
	traceparent string
}

var occurred = time.Date(2026, 12, 1, 10, 0, 0, 123456000, time.UTC)

// insertLegacy writes d for m with NotifyMerchant's body and returns its
// message id.
func insertLegacy(t *testing.T, p *pipeline, m app.CreatedMerchant, d legacy) string {
	t.Helper()
	id := uuidString(t, p)
	body, err := json.Marshal(map[string]any{"type": "payment.paid", "timestamp": occurred,
		"data": map[string]any{"payment_id": id, "amount": 100}})
	require.NoError(t, err)
	var token *string
	if d.leased {
		tok := uuidString(t, p)
		token = &tok
	}
	_, err = p.schema.Pool.Exec(context.Background(), `
		INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, status, attempts, next_attempt_at,
		                                lease_token, last_error, traceparent)
		VALUES ($1, $2, $3, 'payment.paid', $4, $5, $6, now() + $7::interval, $8, $9, $10)`,
		id, m.ID, m.WebhookURL, body, d.status, d.attempts, d.next, token, d.lastError, d.traceparent)
	require.NoError(t, err)
	return id
}

func uuidString(t *testing.T, p *pipeline) string {
	t.Helper()
	var id string
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT gen_random_uuid()::text`).Scan(&id))
	return id
}

func legacyStatus(t *testing.T, p *pipeline, messageID string) string {
	t.Helper()
	var s string
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
		`SELECT status FROM webhook_deliveries WHERE message_id = $1`, messageID).Scan(&s))
	return s
}

// The handover moves the legacy deliveries that are pending and not in
// flight (never leased, waiting for a retry, leased by a sender whose lease
// lapsed), and only them: not one a sender is sending, not a delivered or
// dead one. Each becomes the message its merchant's endpoint is sent, with
// the legacy id, time, payload and trace context, its schedule continued
// (attempts, retry time, last error). One already recorded in the
// framework's tables is not recorded twice, and moves; one whose merchant
// deleted its endpoint is marked dead, recorded nowhere. A delivery in
// flight moves once its lease lapses.
func TestHandOverMovesWhatIsNotInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := handOverPipeline(t)
	m := merchant(t, p, "M", "http://127.0.0.1:1/hook")
	gone := merchant(t, p, "gone", "http://127.0.0.1:1/gone")
	_, err := p.schema.Pool.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, gone.ID)
	require.NoError(t, err)

	e503 := "HTTP 503"
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	unleased := insertLegacy(t, p, m, legacy{status: "pending", next: "0s", traceparent: tp})
	retrying := insertLegacy(t, p, m, legacy{status: "pending", attempts: 3, next: "1 hour", lastError: &e503})
	lapsed := insertLegacy(t, p, m, legacy{status: "pending", attempts: 1, next: "-1 second", leased: true})
	inFlight := insertLegacy(t, p, m, legacy{status: "pending", attempts: 2, next: "1 hour", leased: true})
	delivered := insertLegacy(t, p, m, legacy{status: "delivered", attempts: 1, next: "0s"})
	dead := insertLegacy(t, p, m, legacy{status: "dead", attempts: 10, next: "0s"})
	already := insertLegacy(t, p, m, legacy{status: "pending", next: "0s"})
	orphan := insertLegacy(t, p, gone, legacy{status: "pending", next: "0s"})
	// The framework's handler recorded one of them already.
	r, err := fanout.Enqueue(ctx, p.schema.Pool, webhooks.Message{ID: already, AccountID: m.ID, EventType: "payment.paid",
		OccurredAt: occurred, Payload: json.RawMessage(`{"recorded":"first"}`)}, fanout.Target{}, "")
	require.NoError(t, err)
	require.True(t, r.Recorded)

	moved, err := handlers.HandOver(ctx, p.schema.Pool, 100)
	require.NoError(t, err)
	require.Equal(t, 4, moved)
	for id, want := range map[string]string{unleased: "moved", retrying: "moved", lapsed: "moved", already: "moved",
		inFlight: "pending", delivered: "delivered", dead: "dead", orphan: "dead"} {
		require.Equal(t, want, legacyStatus(t, p, id), id)
	}
	var lastErr string
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT last_error FROM webhook_deliveries WHERE message_id = $1`, orphan).Scan(&lastErr))
	require.Equal(t, handlers.HandOverOrphaned, lastErr)
	require.Zero(t, count(t, p, `SELECT count(*) FROM webhook_messages WHERE id = $1`, orphan), "nothing recorded for it")

	got := readMoved(t, p, unleased)
	require.Equal(t, movedRow{Account: m.ID, Type: "payment.paid", Payload: `{"amount":100,"payment_id":"` + unleased + `"}`,
		Traceparent: tp, Occurred: occurred, Version: 1, Endpoint: m.ID, Due: true}, got, "the body's data and timestamp")
	got = readMoved(t, p, retrying)
	require.Equal(t, 3, got.Attempts, "the schedule continues")
	require.False(t, got.Due, "its retry is not due yet")
	require.Equal(t, &e503, got.LastError)
	got = readMoved(t, p, lapsed)
	require.Equal(t, 1, got.Attempts)
	require.True(t, got.Due, "a lapsed lease is due now")
	got = readMoved(t, p, already)
	require.JSONEq(t, `{"recorded":"first"}`, got.Payload, "recorded once, by the first")
	for _, id := range []string{unleased, retrying, lapsed, already} {
		require.Equal(t, 1, count(t, p, `SELECT count(*) FROM webhook_endpoint_deliveries WHERE message_id = $1`, id))
	}

	moved, err = handlers.HandOver(ctx, p.schema.Pool, 100)
	require.NoError(t, err)
	require.Zero(t, moved, "nothing else is movable")
	_, err = p.schema.Pool.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 second' WHERE message_id = $1`, inFlight)
	require.NoError(t, err) // its lease lapses
	moved, err = handlers.HandOver(ctx, p.schema.Pool, 100)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	require.Equal(t, "moved", legacyStatus(t, p, inFlight))
	require.Equal(t, 2, readMoved(t, p, inFlight).Attempts)
}

// movedRow is a moved delivery as the framework's tables hold it.
type movedRow struct {
	Account, Type, Payload, Traceparent string
	Occurred                            time.Time
	Version, Attempts                   int
	Endpoint                            string
	Due                                 bool
	LastError                           *string
}

// readMoved reads the message id and its one delivery; the payload is
// compacted (re-marshalled, keys sorted) and the time in UTC.
func readMoved(t *testing.T, p *pipeline, id string) movedRow {
	t.Helper()
	var r movedRow
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `
		SELECT m.account_id, m.event_type, convert_from(m.payload, 'UTF8'), m.traceparent, m.occurred_at, m.schema_version,
		       d.attempts, d.endpoint_id::text, d.next_attempt_at <= now(), d.last_error
		FROM webhook_messages m JOIN webhook_endpoint_deliveries d ON d.message_id = m.id WHERE m.id = $1`, id).Scan(
		&r.Account, &r.Type, &r.Payload, &r.Traceparent, &r.Occurred, &r.Version, &r.Attempts, &r.Endpoint, &r.Due, &r.LastError))
	var v any
	require.NoError(t, json.Unmarshal([]byte(r.Payload), &v))
	b, err := json.Marshal(v)
	require.NoError(t, err)
	r.Payload, r.Occurred = string(b), r.Occurred.UTC()
	return r
}

// A legacy sender whose lease lapsed while its request was out, and whose
// row moved meanwhile, settles nothing when its result comes: the attempt
// is recorded with lease_lost, the row stays moved, its attempts as they
// were, and the message is in the framework's queue once.
func TestHandOverLateLegacySettleChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := handOverPipeline(t)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	m := merchant(t, p, "M", srv.URL)
	id := insertLegacy(t, p, m, legacy{status: "pending", next: "0s"})

	sender := newSender(t, p, withPoll(handlers.NotifyConfig{}, time.Hour)) // leases once, at start
	hold := make(chan struct{})
	handlers.SetSettleHook(sender, func(int64) { <-hold })
	run(t, sender.Run)
	t.Cleanup(func() { // before sender.Run's, which waits for the held result
		select {
		case <-hold:
		default:
			close(hold)
		}
	})
	outflowtest.WaitFor(t, 10*time.Second, "the legacy request", func() bool { return calls.Load() == 1 })
	moved, err := handlers.HandOver(ctx, p.schema.Pool, 10)
	require.NoError(t, err)
	require.Zero(t, moved, "in flight: not moved")

	// The lease lapses (its end passes) before the result is settled.
	_, err = p.schema.Pool.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 second' WHERE message_id = $1`, id)
	require.NoError(t, err)
	moved, err = handlers.HandOver(ctx, p.schema.Pool, 10)
	require.NoError(t, err)
	require.Equal(t, 1, moved)

	close(hold)
	outflowtest.WaitFor(t, 10*time.Second, "the late attempt recorded", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.message_id = $1`, id) == 1
	})
	require.Equal(t, 1, count(t, p, `SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id
		WHERE d.message_id = $1 AND a.lease_lost AND a.status_code = 200`, id), "recorded, deciding nothing")
	require.Equal(t, 1, count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE message_id = $1 AND status = 'moved'
		AND attempts = 0 AND delivered_at IS NULL`, id))
	require.Equal(t, 1, count(t, p, `SELECT count(*) FROM webhook_endpoint_deliveries WHERE message_id = $1 AND status = 'pending'`, id))
}

// A legacy sender's lease being taken right now (its row locked) is not
// waited for: the handover moves the others, and leaves that one to the
// sender that leased it.
func TestHandOverSkipsARowBeingLeased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := handOverPipeline(t)
	m := merchant(t, p, "M", "http://127.0.0.1:1/hook")
	leasing := insertLegacy(t, p, m, legacy{status: "pending", next: "0s"})
	other := insertLegacy(t, p, m, legacy{status: "pending", next: "0s"})

	tx, err := p.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM webhook_deliveries WHERE message_id = $1 FOR UPDATE`, leasing)
	require.NoError(t, err)

	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	moved, err := handlers.HandOver(short, p.schema.Pool, 10)
	require.NoError(t, err, "not waiting for the sender's lock")
	require.Equal(t, 1, moved)
	require.Equal(t, "moved", legacyStatus(t, p, other))

	_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET lease_token = gen_random_uuid(), next_attempt_at = now() + interval '1 hour'
		WHERE message_id = $1`, leasing)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	moved, err = handlers.HandOver(ctx, p.schema.Pool, 10)
	require.NoError(t, err)
	require.Zero(t, moved)
	require.Equal(t, "pending", legacyStatus(t, p, leasing), "the sender's")
}

// During the rollout a legacy sender and two handovers run at once: every
// legacy delivery is either sent by the legacy sender or moved, never
// both, never neither; each moved one is recorded once; the merchant gets
// each message once.
func TestHandOverBesideALegacySenderLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := handOverPipeline(t)
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.Header.Get("webhook-id")]++
		mu.Unlock()
		time.Sleep(5 * time.Millisecond) // a merchant taking its time: the handovers find most of the rows still there
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	m := merchant(t, p, "M", srv.URL)
	const n = 200
	ids := map[string]bool{}
	for range n {
		ids[insertLegacy(t, p, m, legacy{status: "pending", next: "0s"})] = true
	}
	stopSender := start(t, newSender(t, p, withPoll(handlers.NotifyConfig{Concurrency: 4}, 5*time.Millisecond)).Run)
	outflowtest.WaitFor(t, 10*time.Second, "the legacy sender under way", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`) >= 10
	})
	stopA := start(t, func(ctx context.Context) error {
		return handlers.RunHandOver(ctx, p.schema.Pool, 5*time.Millisecond, quiet)
	})
	stopB := start(t, func(ctx context.Context) error {
		return handlers.RunHandOver(ctx, p.schema.Pool, 5*time.Millisecond, quiet)
	})
	outflowtest.WaitFor(t, 30*time.Second, "no legacy delivery pending", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'`) == 0
	})
	stopSender()
	stopA()
	stopB()

	type outcome struct {
		ID, Status string
		Queued     int
	}
	rows, err := p.schema.Pool.Query(ctx, `
		SELECT d.message_id::text, d.status, (SELECT count(*) FROM webhook_endpoint_deliveries e WHERE e.message_id = d.message_id)::int
		FROM webhook_deliveries d`)
	require.NoError(t, err)
	outcomes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outcome]) // read before any assertion: a failed one must not hold a connection
	require.NoError(t, err)
	var sent, moved int
	for _, o := range outcomes {
		require.True(t, ids[o.ID])
		switch o.Status {
		case "delivered":
			sent++
			require.Zero(t, o.Queued, "%s sent and moved", o.ID)
			require.Equal(t, 1, got[o.ID], "%s", o.ID)
		case "moved":
			moved++
			require.Equal(t, 1, o.Queued, "%s", o.ID)
			require.Zero(t, got[o.ID], "%s moved and sent by the legacy sender", o.ID)
		default:
			t.Fatalf("%s is %s", o.ID, o.Status)
		}
	}
	require.Equal(t, n, sent+moved)
	require.NotZero(t, sent)
	require.NotZero(t, moved)
	require.Equal(t, moved, count(t, p, `SELECT count(*) FROM webhook_messages`))
	t.Logf("sent by the legacy sender: %d, moved: %d", sent, moved)
}

// RunHandOver says which legacy deliveries it could not move (their
// merchant's endpoint was deleted), by message id, at Warn: marked dead,
// they are not lost silently.
func TestRunHandOverLogsOrphanedDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := handOverPipeline(t)
	m := merchant(t, p, "M", "http://127.0.0.1:1/hook")
	_, err := p.schema.Pool.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, m.ID)
	require.NoError(t, err)
	id := insertLegacy(t, p, m, legacy{status: "pending", next: "0s"})
	var logs outflowtest.LogBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	start(t, func(ctx context.Context) error {
		return handlers.RunHandOver(ctx, p.schema.Pool, 5*time.Millisecond, logger)
	})
	outflowtest.WaitFor(t, 10*time.Second, "the orphan logged", func() bool { return strings.Contains(logs.String(), id) })
	require.Contains(t, logs.String(), "level=WARN")
	require.Equal(t, "dead", legacyStatus(t, p, id))
}
