package claimcheck_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

type scanned struct {
	DocumentID string `json:"document_id"`
	Content    string `json:"content"`
}

func (scanned) EventType() string { return "document.scanned" }

// write commits one document.scanned event of size bytes of content,
// sent by reference, and returns it and its body.
func write(t *testing.T, s *outflowtest.Schema, id string, size int) (events.Event, []byte) {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "docs"}, ClaimCheck: outbox.ClaimCheck{Threshold: 1024}})
	require.NoError(t, err)
	p := scanned{DocumentID: id, Content: strings.Repeat("secret-body-", size/12+1)[:size]}
	ev, err := events.New(ctx, events.Aggregate{Type: "document", ID: id, Version: 1}, p)
	require.NoError(t, err)
	body, err := json.Marshal(p)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))
	return ev, body
}

// published is the message the forwarder publishes for the outbox row of
// messageID, built from the row as the forwarder builds it.
func published(t *testing.T, s *outflowtest.Schema, messageID string) *message.Message {
	t.Helper()
	var r forwarder.Row
	require.NoError(t, s.Pool.QueryRow(context.Background(), `
		SELECT message_id::text, aggregate_type, aggregate_id, aggregate_version, event_type, payload::text, metadata::text, occurred_at
		FROM outbox WHERE message_id = $1`, messageID).Scan(&r.MessageID, &r.AggregateType, &r.AggregateID,
		&r.AggregateVersion, &r.EventType, &r.Payload, &r.Metadata, &r.OccurredAt))
	msg, err := forwarder.Message(r)
	require.NoError(t, err)
	return msg
}

func TestResolveFetchesAndVerifies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	ev, body := write(t, s, "d1", 100_000)
	msg := published(t, s, ev.MessageID)
	require.JSONEq(t, claimcheck.Placeholder, string(msg.Payload), "the broker message never carries the body")

	store := claimcheck.Postgres{DB: s.Pool}
	got, err := claimcheck.Resolve(ctx, store, msg)
	require.NoError(t, err)
	require.Equal(t, body, []byte(got.Payload))
	require.Equal(t, msg.UUID, got.UUID)
	require.NotContains(t, got.Metadata, claimcheck.RefKey)
	require.JSONEq(t, claimcheck.Placeholder, string(msg.Payload), "the message itself keeps the reference")
	reg := events.NewRegistry()
	require.NoError(t, reg.Register(scanned{}))
	dec, err := reg.DecodeMessage(got)
	require.NoError(t, err)
	require.Equal(t, "d1", dec.Payload.(scanned).DocumentID)

	// In the consumer's transaction: same body, and a failure leaves the
	// transaction usable.
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	got, err = claimcheck.ResolveTx(ctx, tx, msg)
	require.NoError(t, err)
	require.Equal(t, body, []byte(got.Payload))
	bad := msg.Copy()
	bad.Metadata.Set(claimcheck.RefKey, "not-a-uuid")
	_, err = claimcheck.ResolveTx(ctx, tx, bad)
	require.ErrorIs(t, err, claimcheck.ErrBodyTampered)
	var one int
	require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one), "the savepoint kept the transaction usable")

	// An inline message is returned as it is, without a query.
	inline := message.NewMessage("x", []byte(`{}`))
	got, err = claimcheck.Resolve(ctx, nil, inline)
	require.NoError(t, err)
	require.Same(t, inline, got)
}

// A body changed after it was written (same size, another content), or a
// reference changed on the way, is refused naming the sentinel; the error
// carries none of the body.
func TestResolveRefusesATamperedBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	ev, _ := write(t, s, "d1", 5_000)
	msg := published(t, s, ev.MessageID)
	store := claimcheck.Postgres{DB: s.Pool}

	_, err := s.Pool.Exec(ctx, `UPDATE outflow_claim_bodies SET body = overlay(body placing 'X'::bytea from 40) WHERE message_id = $1`, ev.MessageID)
	require.NoError(t, err)
	_, err = claimcheck.Resolve(ctx, store, msg)
	require.ErrorIs(t, err, claimcheck.ErrBodyTampered)
	require.Contains(t, err.Error(), "sha256")
	require.NotContains(t, err.Error(), "secret-body")

	// A reference whose digest was changed in transit.
	fresh, _ := write(t, s, "d2", 5_000)
	m2 := published(t, s, fresh.MessageID)
	m2.Metadata.Set(claimcheck.SHA256Key, strings.Repeat("ab", 32))
	_, err = claimcheck.Resolve(ctx, store, m2)
	require.ErrorIs(t, err, claimcheck.ErrBodyTampered)
	m2 = published(t, s, fresh.MessageID)
	m2.Metadata.Set(claimcheck.SizeKey, "12")
	_, err = claimcheck.Resolve(ctx, store, m2)
	require.ErrorIs(t, err, claimcheck.ErrBodyTampered)
	require.Contains(t, err.Error(), "reference says 12")
}

func TestRefFromMetadata(t *testing.T) {
	t.Parallel()
	good := claimcheck.NewRef("0193a3c4-7b1e-7c3e-9a51-2f4a0d6c1b22", []byte("body"))
	md := message.Metadata{}
	good.SetMetadata(md)
	sum := md.Get(claimcheck.SHA256Key)
	tests := []struct {
		name    string
		md      message.Metadata
		wantOK  bool
		wantErr bool
	}{
		{"none", message.Metadata{"event_type": "x"}, false, false},
		{"complete", md, true, false},
		{"no ref", message.Metadata{claimcheck.SHA256Key: sum, claimcheck.SizeKey: "4"}, true, true},
		{"short digest", message.Metadata{claimcheck.RefKey: "a", claimcheck.SHA256Key: "abcd", claimcheck.SizeKey: "4"}, true, true},
		{"not hex", message.Metadata{claimcheck.RefKey: "a", claimcheck.SHA256Key: strings.Repeat("zz", 32), claimcheck.SizeKey: "4"}, true, true},
		{"no size", message.Metadata{claimcheck.RefKey: "a", claimcheck.SHA256Key: sum}, true, true},
		{"negative size", message.Metadata{claimcheck.RefKey: "a", claimcheck.SHA256Key: sum, claimcheck.SizeKey: "-1"}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, ok, err := claimcheck.RefFromMetadata(tt.md)
			require.Equal(t, tt.wantOK, ok)
			if tt.wantErr {
				require.ErrorIs(t, err, claimcheck.ErrBodyTampered)
				return
			}
			require.NoError(t, err)
			if ok {
				require.Equal(t, good, ref)
				require.NoError(t, ref.Verify([]byte("body")))
			}
		})
	}
}

// Retention: the forwarder's purge removes a body with its event, at the
// same cutoff, never before it: a day's partition dropped whole, a body of
// the default partition deleted; a redelivery of the event afterwards (a
// replay from a broker that kept it longer) fails with ErrBodyGone.
func TestBodyPurgedWithItsEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	old, _ := write(t, s, "old", 5_000)
	older, _ := write(t, s, "older", 5_000)
	oldMsg := published(t, s, old.MessageID)
	// The old body's day has a partition, the older one's does not (it
	// lands in the default partition).
	oldDay := time.Now().Add(-20 * 24 * time.Hour)
	require.NoError(t, claimcheck.EnsurePartitions(ctx, s.Pool, oldDay))
	dayPartition := "outflow_claim_bodies_" + oldDay.UTC().Format("20060102")
	for _, q := range []string{
		`UPDATE outbox SET created_at = now() - interval '30 days'`,
		`UPDATE outflow_claim_bodies SET created_at = now() - interval '20 days' WHERE message_id = '` + old.MessageID + `'`,
		`UPDATE outflow_claim_bodies SET created_at = now() - interval '30 days' WHERE message_id = '` + older.MessageID + `'`,
		`INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 1)`,
		`INSERT INTO outbox_partitions (partition, published_through) VALUES (0, 0)`,
	} {
		_, err := s.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	count := func(q string) (n int) {
		t.Helper()
		require.NoError(t, s.Pool.QueryRow(ctx, q).Scan(&n))
		return n
	}
	require.Equal(t, 1, count(`SELECT count(*) FROM `+dayPartition))
	require.Equal(t, 1, count(`SELECT count(*) FROM outflow_claim_bodies_default`))

	// Old, but their events are not published: all stay.
	_, err := forwarder.Purge(ctx, s.Pool, 15*24*time.Hour, 10)
	require.NoError(t, err)
	require.Equal(t, 2, count(`SELECT count(*) FROM outbox`))
	require.Equal(t, 2, count(`SELECT count(*) FROM outflow_claim_bodies`), "a body never goes before its event")

	// Published (their partition wholly below the cursor) and old: the
	// outbox's partition is dropped, the bodies go with it, the day's
	// partition whole.
	_, err = s.Pool.Exec(ctx, `UPDATE outbox_partitions SET published_through = 100000000`)
	require.NoError(t, err)
	_, err = forwarder.Purge(ctx, s.Pool, 15*24*time.Hour, 10)
	require.NoError(t, err)
	require.Zero(t, count(`SELECT count(*) FROM outbox`), "the events are gone")
	require.Zero(t, count(`SELECT count(*) FROM outflow_claim_bodies`), "their bodies with them")
	require.Zero(t, count(`SELECT count(*) FROM pg_class WHERE relname = '`+dayPartition+`' AND relnamespace = current_schema()::regnamespace`),
		"the day's partition dropped whole")
	today := "outflow_claim_bodies_" + time.Now().UTC().Format("20060102")
	require.Equal(t, 1, count(`SELECT count(*) FROM pg_class WHERE relname = '`+today+`' AND relnamespace = current_schema()::regnamespace`),
		"today's partition made ahead, kept")

	_, err = claimcheck.Resolve(ctx, claimcheck.Postgres{DB: s.Pool}, oldMsg)
	require.ErrorIs(t, err, claimcheck.ErrBodyGone)
	require.Contains(t, err.Error(), old.MessageID)
}

// Migration 00033's rights: a role that may use the schema but is not
// granted outflow_claim_reader cannot read a body (ErrBodyForbidden,
// naming the role to grant); a member of it can.
func TestOnlyTheReaderRoleReadsBodies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	ev, body := write(t, s, "d1", 5_000)
	msg := published(t, s, ev.MessageID)

	pool, id := roleOf(t, s, "role")

	_, err := claimcheck.Resolve(ctx, claimcheck.Postgres{DB: pool}, msg)
	require.ErrorIs(t, err, claimcheck.ErrBodyForbidden)
	require.Contains(t, err.Error(), claimcheck.ReaderRole)
	require.NotContains(t, err.Error(), "secret-body")

	_, err = s.Pool.Exec(ctx, `GRANT `+claimcheck.ReaderRole+` TO `+id)
	require.NoError(t, err)
	got, err := claimcheck.Resolve(ctx, claimcheck.Postgres{DB: pool}, msg)
	require.NoError(t, err)
	require.Equal(t, body, []byte(got.Payload))
}
