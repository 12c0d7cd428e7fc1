package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

// bodyMark is in every large body of these tests: a log line, a dead
// letter or an error holding it leaked the body.
const bodyMark = "secret-body-"

// publishByReference writes an order.placed event whose payload (a
// 100 KB note) goes by reference, as the forwarder would publish it, onto
// the rig's stream, and returns its message id.
func (r *rig) publishByReference(t *testing.T, orderID string) string {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": ordersTopic}, ClaimCheck: outbox.ClaimCheck{Threshold: 1024}})
	require.NoError(t, err)
	ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: orderID, Version: 1},
		orderPlaced{OrderID: orderID, Amount: 10, Note: strings.Repeat(bodyMark, 100_000/len(bodyMark))})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, r.schema.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))
	var row forwarder.Row
	require.NoError(t, r.schema.Pool.QueryRow(ctx, `
		SELECT message_id::text, aggregate_type, aggregate_id, aggregate_version, event_type, payload::text, metadata::text, occurred_at
		FROM outbox WHERE message_id = $1`, ev.MessageID).Scan(&row.MessageID, &row.AggregateType, &row.AggregateID,
		&row.AggregateVersion, &row.EventType, &row.Payload, &row.Metadata, &row.OccurredAt))
	msg, err := forwarder.Message(row)
	require.NoError(t, err)
	require.NotContains(t, string(msg.Payload), bodyMark, "the broker message never carries the body")
	for i, err := range r.broker.Publish(ctx, []forwarder.Outgoing{{Topic: ordersTopic, AggregateID: orderID, Message: msg}}) {
		require.NoError(t, err, "publish %d", i)
	}
	return ev.MessageID
}

// deadLetter reads the consumer's dead letter of messageID.
func (r *rig) deadLetter(t *testing.T, name, messageID string) (status, errText, payload, metadata string, ok bool) {
	t.Helper()
	err := r.schema.Pool.QueryRow(context.Background(), `
		SELECT status, error, convert_from(payload, 'UTF8'), metadata::text FROM dead_letters WHERE consumer = $1 AND message_id = $2`,
		name, messageID).Scan(&status, &errText, &payload, &metadata)
	if err == pgx.ErrNoRows {
		return "", "", "", "", false
	}
	require.NoError(t, err)
	return status, errText, payload, metadata, true
}

// A handler gets the body of an event that travelled by reference, fetched
// and verified in its transaction; a body tampered with is refused
// (ErrBodyTampered) and dead-lettered with its reference, the handler never
// called.
func TestWorkerResolvesBodiesByReference(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	logs := &outflowtest.LogBuffer{}
	cfg := r.config()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	var notes sync.Map
	require.NoError(t, w.Add(consumer.Handler{Name: "notes", Topic: ordersTopic,
		Idempotency: idempotency.Config{MaxAttempts: 1},
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			notes.Store(ev.MessageID, ev.Payload.(orderPlaced).Note)
			return record("notes")(ctx, tx, ev)
		}}))

	good := r.publishByReference(t, "o-1")
	tampered := r.publishByReference(t, "o-2")
	_, err = r.schema.Pool.Exec(context.Background(),
		`UPDATE outflow_claim_bodies SET body = overlay(body placing 'X'::bytea from 60) WHERE message_id = $1`, tampered)
	require.NoError(t, err)
	run(t, w)

	outflowtest.WaitFor(t, 20*time.Second, "the good event handled", func() bool { return r.handled(t, "notes", good) })
	note, _ := notes.Load(good)
	require.Len(t, note, 100_000/len(bodyMark)*len(bodyMark), "the handler got the whole body")
	outflowtest.WaitFor(t, 20*time.Second, "the tampered event dead", func() bool {
		st, _, _, _, ok := r.deadLetter(t, "notes", tampered)
		return ok && st == "dead"
	})
	_, errText, payload, md, _ := r.deadLetter(t, "notes", tampered)
	require.Contains(t, errText, claimcheck.ErrBodyTampered.Error())
	_, called := notes.Load(tampered)
	require.False(t, called, "the handler never saw the tampered body")
	require.JSONEq(t, claimcheck.Placeholder, payload, "the dead letter keeps the reference, not the body")
	require.Contains(t, md, claimcheck.RefKey)
	require.NotContains(t, errText+md, bodyMark)
	require.NotContains(t, logs.String(), bodyMark)
}

// A consumer whose database role is not granted outflow_claim_reader
// cannot read a body: the fetch fails with ErrBodyForbidden, the handler
// never sees the body, the message is dead-lettered with its reference
// only, and nothing of the body reaches the logs. Granted the role, a
// retry of the dead letter applies it.
func TestWorkerWithoutTheRightNeverSeesTheBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t)
	role := restrictedRole(t, r.schema)
	pool := poolAs(t, r.schema, role)

	logs := &outflowtest.LogBuffer{}
	cfg := r.config()
	cfg.Pool = pool
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	var calls atomic.Int32
	var seen atomic.Value
	require.NoError(t, w.Add(consumer.Handler{Name: "audit", Topic: ordersTopic,
		Idempotency: idempotency.Config{MaxAttempts: 1, RetryBackoff: 10 * time.Millisecond},
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			calls.Add(1)
			seen.Store(ev.Payload.(orderPlaced).Note)
			return record("audit")(ctx, tx, ev)
		}}))
	id := r.publishByReference(t, "o-1")
	run(t, w)

	outflowtest.WaitFor(t, 20*time.Second, "the event dead for want of the right", func() bool {
		st, _, _, _, ok := r.deadLetter(t, "audit", id)
		return ok && st == "dead"
	})
	_, errText, payload, md, _ := r.deadLetter(t, "audit", id)
	require.Contains(t, errText, claimcheck.ErrBodyForbidden.Error())
	require.Contains(t, errText, claimcheck.ReaderRole, "the error says what to grant")
	require.Zero(t, calls.Load(), "the handler never ran")
	require.JSONEq(t, claimcheck.Placeholder, payload)
	require.NotContains(t, errText+md, bodyMark)
	require.NotContains(t, logs.String(), bodyMark)

	// Granted the right, the operator's retry applies it.
	_, err = r.schema.Pool.Exec(ctx, `GRANT `+claimcheck.ReaderRole+` TO `+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	_, err = idempotency.RetryDeadLetter(ctx, r.schema.Pool, "audit", 0)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 20*time.Second, "the retried event handled", func() bool { return r.handled(t, "audit", id) })
	require.Contains(t, seen.Load(), bodyMark)
}

// restrictedRole creates a login role that may do everything a consumer
// does in s but read the bodies by reference, dropped when t ends.
func restrictedRole(t *testing.T, s *outflowtest.Schema) string {
	t.Helper()
	ctx := context.Background()
	role := strings.ReplaceAll(s.Name, "outflowtest_", "outflowtest_role_")
	id := pgx.Identifier{role}.Sanitize()
	schema := pgx.Identifier{s.Name}.Sanitize()
	_, err := s.Pool.Exec(ctx, `CREATE ROLE `+id+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		// After the role's pool closed (cleanups run last first), before
		// the schema is dropped.
		_, err := s.Pool.Exec(context.Background(), `DROP OWNED BY `+id+`; DROP ROLE `+id)
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	for _, q := range []string{
		`GRANT USAGE, CREATE ON SCHEMA ` + schema + ` TO ` + id,
		`GRANT ALL ON ALL TABLES IN SCHEMA ` + schema + ` TO ` + id,
		`GRANT ALL ON ALL SEQUENCES IN SCHEMA ` + schema + ` TO ` + id,
		`REVOKE ALL ON ` + schema + `.outflow_claim_bodies FROM ` + id,
	} {
		_, err := s.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	return role
}

// poolAs connects to s as role.
func poolAs(t *testing.T, s *outflowtest.Schema, role string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// flakyStore fails its first fetches as a lost connection would, then
// reads as the store it wraps.
type flakyStore struct {
	claimcheck.Postgres
	failures atomic.Int32
}

func (f *flakyStore) Get(ctx context.Context, ref claimcheck.Ref) ([]byte, error) {
	if f.failures.Add(-1) >= 0 {
		return nil, errors.New("read tcp 10.0.0.7:5432: connection reset by peer")
	}
	return f.Postgres.Get(ctx, ref)
}

// A fetch that fails transiently (the store of WorkerConfig.Bodies lost
// its connection) is retried like any handler error, and the event
// applies once it reads.
func TestWorkerRetriesATransientFetch(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	store := &flakyStore{Postgres: claimcheck.Postgres{DB: r.schema.Pool}}
	store.failures.Store(2)
	cfg := r.config()
	cfg.Bodies = store
	w, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	require.NoError(t, w.Add(consumer.Handler{Name: "retry", Topic: ordersTopic,
		Idempotency: idempotency.Config{MaxAttempts: 5, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond},
		Func:        record("retry")}))
	id := r.publishByReference(t, "o-1")
	run(t, w)
	outflowtest.WaitFor(t, 20*time.Second, "the event applied after the failed fetches", func() bool { return r.handled(t, "retry", id) })
	require.LessOrEqual(t, store.failures.Load(), int32(-1), "fetched after two failures")
}
