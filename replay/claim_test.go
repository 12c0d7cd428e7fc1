package replay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

type scannedDoc struct {
	DocumentID string `json:"document_id"`
	Content    string `json:"content"`
}

func (scannedDoc) EventType() string { return "document.scanned" }

// A replay publishes an event whose body travels by reference as the
// forwarder did: the reference, never the body; a consumer resolves it
// as it did the first time, and once the body is purged with its event
// the replayed message fails with ErrBodyGone.
func TestReplayOfABodyByReferenceCarriesTheReference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "t"}, ClaimCheck: outbox.ClaimCheck{Threshold: 1024}})
	require.NoError(t, err)
	ev, err := events.New(ctx, events.Aggregate{Type: "a", ID: "x", Version: 1},
		scannedDoc{DocumentID: "x", Content: strings.Repeat("secret-body-", 5000)})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))
	var last int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&last))
	require.NoError(t, outflowtest.PublishThrough(ctx, s.Pool, last))
	rc := testservers.Redis(t)
	b, err := redisstreams.New(redisstreams.Config{Client: rc, StreamPrefix: testservers.UniqueName(t, rc) + ":"})
	require.NoError(t, err)

	n, err := replay.Publish(ctx, s.Pool, b, "c1", replay.Filter{Topic: "t", AggregateType: "a", AggregateIDs: []string{"x"}}, replay.Options{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	streams := b.Streams(consumer.ReplayTopic("c1"))
	entries, err := rc.XRange(ctx, streams[0], "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	m, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(entries[0].Values)
	require.NoError(t, err)
	require.JSONEq(t, claimcheck.Placeholder, string(m.Payload), "the replayed message carries no body")
	require.Equal(t, ev.MessageID, m.Metadata.Get(claimcheck.RefKey))

	store := claimcheck.Postgres{DB: s.Pool}
	got, err := claimcheck.Resolve(ctx, store, m)
	require.NoError(t, err)
	require.Contains(t, string(got.Payload), "secret-body-")

	// Retention removes the event and its body: the replayed message is
	// then a clear ErrBodyGone.
	_, err = s.Pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '20 days'`)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE outflow_claim_bodies SET created_at = now() - interval '20 days'`)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE outbox_partitions SET published_through = 100000000`)
	require.NoError(t, err)
	_, err = forwarder.Purge(ctx, s.Pool, 15*24*time.Hour, 100)
	require.NoError(t, err)
	_, err = claimcheck.Resolve(ctx, store, m)
	require.ErrorIs(t, err, claimcheck.ErrBodyGone)
}
