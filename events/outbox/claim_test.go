package outbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// scanned is the tests' large event: a document's content.
type scanned struct {
	DocumentID string `json:"document_id"`
	Content    string `json:"content"`
}

func (scanned) EventType() string { return "document.scanned" }

func bigEvent(t *testing.T, id string, size int) (events.Event, []byte) {
	t.Helper()
	p := scanned{DocumentID: id, Content: strings.Repeat("secret-body-", size/12+1)[:size]}
	ev, err := events.New(context.Background(), events.Aggregate{Type: "document", ID: id, Version: 1}, p)
	require.NoError(t, err)
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return ev, b
}

type storedBody struct {
	MessageID string
	SHA256    []byte
	Size      int
	Body      []byte
}

func readBodies(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []storedBody {
	t.Helper()
	rows, err := q.Query(context.Background(), `SELECT message_id::text, sha256, size, body FROM outflow_claim_bodies ORDER BY message_id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[storedBody])
	require.NoError(t, err)
	return out
}

// Table mode: a payload at the threshold goes by reference in each of
// the three ways of writing, stored once (the body in
// outflow_claim_bodies, the row the placeholder and the reference), in the
// business transaction; a smaller one stays inline; MaxEventBytes applies
// to what travels, and MaxBodyBytes to the body.
func TestClaimCheckTableModeStoresTheBodyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "docs"}, MaxEventBytes: 4096,
		ClaimCheck: outbox.ClaimCheck{Threshold: 1024, MaxBodyBytes: 200_000}})
	require.NoError(t, err)

	big1, body1 := bigEvent(t, "d1", 100_000)
	big2, body2 := bigEvent(t, "d2", 50_000)
	big3, body3 := bigEvent(t, "d3", 2_000)
	small, _ := bigEvent(t, "d4", 100)

	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, tx, big1, small))
	require.NoError(t, tx.Commit(ctx))

	tx, err = s.Pool.Begin(ctx)
	require.NoError(t, err)
	b := &pgx.Batch{}
	require.NoError(t, w.QueueTx(ctx, tx, b, big2))
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	require.NoError(t, tx.Commit(ctx))

	std := stdlib.OpenDBFromPool(s.Pool)
	defer std.Close()
	stx, err := std.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.PublishStdTx(ctx, stx, big3))
	require.NoError(t, stx.Commit())

	// A rollback leaves neither the row nor the body.
	tx, err = s.Pool.Begin(ctx)
	require.NoError(t, err)
	rolled, _ := bigEvent(t, "d5", 10_000)
	require.NoError(t, w.PublishTx(ctx, tx, rolled))
	require.NoError(t, tx.Rollback(ctx))

	rows := readRows(t, s)
	require.Len(t, rows, 4)
	bodies := readBodies(t, s.Pool)
	require.Len(t, bodies, 3, "one body per event by reference, none for the inline one nor the rollback")
	want := map[string][]byte{big1.MessageID: body1, big2.MessageID: body2, big3.MessageID: body3}
	for _, bd := range bodies {
		require.Equal(t, want[bd.MessageID], bd.Body, "the very bytes the writer encoded")
		sum := sha256.Sum256(bd.Body)
		require.Equal(t, sum[:], bd.SHA256)
		require.Equal(t, len(bd.Body), bd.Size)
	}
	for _, r := range rows {
		body, byRef := want[r.MessageID]
		if !byRef {
			require.Contains(t, string(r.Payload), `"document_id": "d4"`, "below the threshold: inline")
			require.NotContains(t, r.Metadata, claimcheck.RefKey)
			continue
		}
		require.JSONEq(t, claimcheck.Placeholder, string(r.Payload), "stored once: the row holds no body")
		sum := sha256.Sum256(body)
		require.Equal(t, r.MessageID, r.Metadata[claimcheck.RefKey])
		require.Equal(t, hex.EncodeToString(sum[:]), r.Metadata[claimcheck.SHA256Key])
		require.Equal(t, strconv.Itoa(len(body)), r.Metadata[claimcheck.SizeKey])
		require.NotContains(t, r.Metadata, events.SchemaVersionKey, "version 1: no key, as inline")
	}

	// Over MaxBodyBytes: refused inside the transaction, named, nothing
	// written.
	huge, _ := bigEvent(t, "d6", 300_000)
	tx, err = s.Pool.Begin(ctx)
	require.NoError(t, err)
	err = w.PublishTx(ctx, tx, huge)
	require.ErrorIs(t, err, outbox.ErrEventTooLarge)
	var tl *outbox.EventTooLargeError
	require.True(t, errors.As(err, &tl))
	require.True(t, tl.ByReference)
	require.Equal(t, 200_000, tl.Limit)
	require.Contains(t, err.Error(), "ClaimCheck.MaxBodyBytes")
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, readBodies(t, s.Pool), 3)
	require.Equal(t, 4, countRows(t, s))

	// Without the claim check the same event is over MaxEventBytes.
	plain, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "docs"}, MaxEventBytes: 4096})
	require.NoError(t, err)
	again, _ := bigEvent(t, "d7", 100_000)
	tx, err = s.Pool.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, plain.PublishTx(ctx, tx, again), outbox.ErrEventTooLarge)
	require.NoError(t, tx.Rollback(ctx))
}

func TestClaimCheckConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		maxEvent int
		cc       outbox.ClaimCheck
		want     string // "" : accepted
	}{
		{"negative threshold", 0, outbox.ClaimCheck{Threshold: -1}, "ClaimCheck.Threshold"},
		{"body limit below threshold", 0, outbox.ClaimCheck{Threshold: 1000, MaxBodyBytes: 10}, "ClaimCheck.MaxBodyBytes"},
		{"threshold within the default event limit", 0, outbox.ClaimCheck{Threshold: 1000}, ""},
		{"threshold at the event limit", 4096, outbox.ClaimCheck{Threshold: 4096}, ""},
		// A payload of 5000 bytes: too large inline, too small to go by
		// reference.
		{"threshold above MaxEventBytes", 4096, outbox.ClaimCheck{Threshold: 8192}, "ClaimCheck.Threshold: 8192 is above the writer's event limit of 4096"},
		{"threshold above the default MaxEventBytes", 0, outbox.ClaimCheck{Threshold: outbox.DefaultMaxEventBytes + 1}, "ClaimCheck.Threshold"},
		{"no event limit, threshold above the default body limit", -1, outbox.ClaimCheck{Threshold: outbox.DefaultMaxBodyBytes + 1},
			"ClaimCheck.MaxBodyBytes: 67108864 is below ClaimCheck.Threshold 67108865"},
		{"no event limit, no body limit", -1, outbox.ClaimCheck{Threshold: outbox.DefaultMaxBodyBytes + 1, MaxBodyBytes: -1}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := outbox.NewWriter(outbox.Config{MaxEventBytes: tt.maxEvent, ClaimCheck: tt.cc})
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// WAL mode: the body goes into outflow_claim_bodies in the transaction,
// the logical decoding message carries only the reference.
func TestClaimCheckWALModeEmitsTheReference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testservers.StartLogicalPostgres(t)
	_, err := migrations.UpSetsPool(ctx, pg.Pool, migrations.Config{}, migrations.Framework())
	require.NoError(t, err)
	_, err = pg.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('t', 'test_decoding')`)
	require.NoError(t, err)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "docs"}, Mode: outbox.ModeWAL,
		MaxEventBytes: 4096, ClaimCheck: outbox.ClaimCheck{Threshold: 1024}})
	require.NoError(t, err)

	big, body := bigEvent(t, uuid.NewString(), 100_000)
	tx, err := pg.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, tx, big))
	require.NoError(t, tx.Commit(ctx))
	rolled, _ := bigEvent(t, uuid.NewString(), 100_000)
	tx, err = pg.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, tx, rolled))
	require.NoError(t, tx.Rollback(ctx))

	msgs, _ := walMessages(t, pg, "t")
	require.Len(t, msgs, 1)
	ev := msgs[0].Events[0]
	require.JSONEq(t, claimcheck.Placeholder, string(ev.Payload))
	require.Equal(t, big.MessageID, ev.Metadata[claimcheck.RefKey])
	require.Equal(t, strconv.Itoa(len(body)), ev.Metadata[claimcheck.SizeKey])
	bodies := readBodies(t, pg.Pool)
	require.Len(t, bodies, 1)
	require.Equal(t, body, bodies[0].Body)
}
