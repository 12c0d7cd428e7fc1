package replay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

// seed writes n published rows of aggregate type "a", ids a0..a9, and one
// pending row.
func seed(t *testing.T, s *outflowtest.Schema, n int) {
	t.Helper()
	_, err := s.Pool.Exec(context.Background(), `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), 't', 'a', 'a' || (i % 10), i / 10 + 1, 'e', jsonb_build_object('i', i), now()
		FROM generate_series(0, $1 - 1) i`, n)
	require.NoError(t, err)
	var last int64
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT max(id) FROM outbox`).Scan(&last))
	require.NoError(t, outflowtest.PublishThrough(context.Background(), s.Pool, last))
	_, err = s.Pool.Exec(context.Background(), `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES (gen_random_uuid(), 't', 'a', 'a1', 1000, 'e', '{}', now())`)
	require.NoError(t, err)
}

// Select pages through the chosen published rows in id order, each once.
func TestSelectPagesInIDOrder(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	seed(t, s, 95)
	ctx := context.Background()
	f := replay.Filter{AggregateType: "a", AggregateIDs: []string{"a1", "a3"}}
	n, err := replay.Count(ctx, s.Pool, f)
	require.NoError(t, err)
	require.EqualValues(t, 20, n, "10 published rows each, not the pending one")
	var ids []int64
	var batches int
	require.NoError(t, replay.Select(ctx, s.Pool, f, 4, func(rows []replay.Row) error {
		batches++
		for _, r := range rows {
			require.Contains(t, []string{"a1", "a3"}, r.AggregateID)
			require.NotEmpty(t, r.Payload)
			ids = append(ids, r.ID)
		}
		return nil
	}))
	require.Len(t, ids, 20)
	require.IsIncreasing(t, ids)
	require.Equal(t, 5, batches)
	_, err = replay.Count(ctx, s.Pool, replay.Filter{})
	require.ErrorIs(t, err, replay.ErrEmptyFilter)
}

// The aggregate filters are served by outbox_aggregate_version_idx (which
// has every row, published or not): with sequential scans priced out, the
// plans of Select and of the reset's delete name it, so they never read
// the whole outbox; whether a row is published is then read by primary
// keys (outbox_failures, outbox_partitions).
func TestAggregateQueriesUseTheIndex(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	seed(t, s, 50)
	ctx := context.Background()
	explain := func(q string, args ...any) string {
		var plan []string
		err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `EXPLAIN `+q, args...)
			if err != nil {
				return err
			}
			plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		require.NoError(t, err)
		return strings.Join(plan, "\n")
	}
	ids := []string{"a1", "a2"}
	sel := explain(`SELECT o.id FROM outbox o WHERE o.id > $1 AND o.topic = $2
		AND o.aggregate_type = $3 AND o.aggregate_id = ANY($4::text[]) AND `+replay.PublishedCond+` ORDER BY o.id LIMIT 10`, 0, "t", "a", ids)
	require.Contains(t, sel, "outbox_aggregate_version_idx", sel)
	require.Contains(t, sel, "outbox_failures_pkey", sel)
	del := explain(`DELETE FROM processed_messages p WHERE p.consumer = $1 AND p.message_id IN (
		SELECT o.message_id FROM outbox o WHERE o.aggregate_type = $2 AND o.aggregate_id = ANY($3::text[]))`,
		"c", "a", ids)
	require.Contains(t, del, "outbox_aggregate_version_idx", del)
	require.NotContains(t, sel+del, "Seq Scan on outbox ", fmt.Sprint(sel, "\n", del))
	require.NotContains(t, sel+del, "Seq Scan on outbox_failures", fmt.Sprint(sel, "\n", del))
}

// ResetConsumer forgets one consumer's state of the chosen aggregates,
// pending rows' processed messages included, and nothing else; Also runs
// in its transaction, and its failure undoes the reset.
func TestResetConsumer(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	seed(t, s, 30)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO processed_messages (message_id, consumer) SELECT message_id, c FROM outbox, unnest(ARRAY['c1', 'c2']) c;
		INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version)
		SELECT c, 'a', 'a' || i, 3 FROM unnest(ARRAY['c1', 'c2']) c, generate_series(0, 9) i;
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata, status, reason)
		SELECT c, gen_random_uuid(), 'e', 'a', 'a1', 4, '', '{}', st, 'x'
		FROM unnest(ARRAY['c1', 'c2']) c, unnest(ARRAY['dead', 'held', 'resolved']) st`)
	require.NoError(t, err)
	count := func(q string) (n int) {
		require.NoError(t, s.Pool.QueryRow(ctx, q).Scan(&n))
		return n
	}
	state := func() string {
		return fmt.Sprint(count(`SELECT count(*) FROM processed_messages WHERE consumer = 'c1'`),
			count(`SELECT count(*) FROM processed_messages WHERE consumer = 'c2'`),
			count(`SELECT count(*) FROM consumer_aggregate_versions WHERE consumer = 'c1' AND version > 0`),
			count(`SELECT count(*) FROM consumer_aggregate_versions WHERE consumer = 'c2' AND version > 0`),
			count(`SELECT count(*) FROM dead_letters WHERE consumer = 'c1'`),
			count(`SELECT count(*) FROM dead_letters WHERE consumer = 'c2'`))
	}
	require.Equal(t, "31 31 10 10 3 3", state())

	_, err = replay.ResetConsumer(ctx, s.Pool, replay.Reset{Consumer: "c1", AggregateType: "a", AggregateIDs: []string{"a1", "a2"},
		Also: func(context.Context, pgx.Tx) error { return fmt.Errorf("projection busy") }})
	require.ErrorContains(t, err, "projection busy")
	require.Equal(t, "31 31 10 10 3 3", state(), "a failed Also undoes the reset")

	var also int
	res, err := replay.ResetConsumer(ctx, s.Pool, replay.Reset{Consumer: "c1", AggregateType: "a",
		AggregateIDs: []string{"a2", "a1", "a1", "new"},
		Also: func(ctx context.Context, tx pgx.Tx) error {
			// The consumer's versions are forgotten in the transaction Also runs in.
			return tx.QueryRow(ctx, `SELECT count(*) FROM consumer_aggregate_versions WHERE consumer = 'c1' AND version > 0`).Scan(&also)
		}})
	require.NoError(t, err)
	require.Equal(t, replay.ResetResult{Processed: 7, Versions: 2, DeadLetters: 2}, res,
		"a1: 3 published and the pending row, a2: 3; the row of the unseen aggregate is not counted")
	require.Equal(t, 8, also)
	require.Equal(t, "24 31 8 10 1 3", state(), "c2 untouched; c1's resolved dead letter kept")

	res, err = replay.ResetConsumer(ctx, s.Pool, replay.Reset{Consumer: "c2", AggregateType: "a", AllAggregates: true})
	require.NoError(t, err)
	require.Equal(t, replay.ResetResult{Processed: 31, Versions: 10, DeadLetters: 2}, res)
	require.Equal(t, "24 0 8 0 1 1", state())
}

// A discarded row replays as its discard marker, as the forwarder
// published it: never the payload the operator gave up on.
func TestReplayOfADiscardedRowIsItsMarker(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, metadata,
		                    occurred_at, discarded_at)
		VALUES ('0190c0de-0000-7000-8000-000000000001', 't', 'a', 'x', 1, 'e', '{"kept": true}', '{}', now(), NULL),
		       ('0190c0de-0000-7000-8000-000000000002', 't', 'a', 'x', 2, 'e', '{"poison": true}', '{"correlation_id": "c"}',
		        now(), '2026-01-02 03:04:05Z')`) // the outbox's discarded_at: a row discarded before 00025
	require.NoError(t, err)
	var last int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&last))
	require.NoError(t, outflowtest.PublishThrough(ctx, s.Pool, last))
	rc := testservers.Redis(t)
	b, err := redisstreams.New(redisstreams.Config{Client: rc, StreamPrefix: testservers.UniqueName(t, rc) + ":"})
	require.NoError(t, err)

	n, err := replay.Publish(ctx, s.Pool, b, "c1", replay.Filter{Topic: "t", AggregateType: "a", AggregateIDs: []string{"x"}}, replay.Options{})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	streams := b.Streams(consumer.ReplayTopic("c1"))
	require.Len(t, streams, 1)
	entries, err := rc.XRange(ctx, streams[0], "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 2)
	var got []*message.Message
	for _, en := range entries {
		m, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(en.Values)
		require.NoError(t, err)
		got = append(got, m)
	}
	require.False(t, events.IsDiscardMarker(got[0]))
	require.JSONEq(t, `{"kept": true}`, string(got[0].Payload))
	require.True(t, events.IsDiscardMarker(got[1]))
	require.Equal(t, "0190c0de-0000-7000-8000-000000000002", got[1].UUID)
	require.Equal(t, "{}", string(got[1].Payload))
	require.Equal(t, "e", got[1].Metadata.Get(events.DiscardedEventTypeKey))
	require.Equal(t, "2026-01-02T03:04:05Z", got[1].Metadata.Get(events.DiscardedAtKey))
	require.Equal(t, "c", got[1].Metadata.Get(events.CorrelationIDKey))
}

// Replay chooses the rows the view outbox_state reads published, in each
// case of its rule (the filter writes the rule out).
func TestSelectChoosesWhatOutboxStateReadsPublished(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	require.NoError(t, outflowtest.SeedOutboxStates(ctx, s.Pool))
	rows, err := s.Pool.Query(ctx, `SELECT id FROM outbox_state WHERE published ORDER BY id`)
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	var got []int64
	require.NoError(t, replay.Select(ctx, s.Pool, replay.Filter{All: true}, 7, func(rows []replay.Row) error {
		for _, r := range rows {
			got = append(got, r.ID)
		}
		return nil
	}))
	require.Equal(t, want, got)
	n, err := replay.Count(ctx, s.Pool, replay.Filter{AggregateType: "a", AggregateIDs: []string{"a1", "a2", "a3"}})
	require.NoError(t, err)
	var wantN int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox o JOIN outbox_state s USING (id)
		WHERE s.published AND o.aggregate_id IN ('a1', 'a2', 'a3')`).Scan(&wantN))
	require.Equal(t, wantN, n)
}
