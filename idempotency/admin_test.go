package idempotency_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

// ListDeadLetters lists the open dead letters of every status, of one
// consumer or all, oldest first up to the limit, interleaved as their ids
// are; resolved and discarded ones never.
func TestListDeadLettersInIDOrder(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	statuses := []string{"held", "resolved", "dead", "retrying", "discarded", "dead", "held", "retrying"}
	type row struct {
		id               int64
		consumer, status string
	}
	var rows []row
	for i := range 16 {
		r := row{consumer: []string{"a", "b"}[i%2], status: statuses[i%len(statuses)]}
		require.NoError(t, s.Pool.QueryRow(ctx, `
			INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
			                          payload, metadata, status, reason)
			VALUES ($1, $2, 'e', 'acct', $3, 1, '\x7b7d', '{}', $4, 'failed') RETURNING id`,
			r.consumer, fmt.Sprintf("00000000-0000-0000-0000-%012d", i+1), fmt.Sprint(i), r.status).Scan(&r.id))
		rows = append(rows, r)
	}
	for _, tt := range []struct {
		consumer string
		limit    int
	}{{"", 100}, {"", 5}, {"a", 100}, {"b", 3}, {"nobody", 10}} {
		want := []int64{}
		for _, r := range rows {
			if r.status != "resolved" && r.status != "discarded" && (tt.consumer == "" || r.consumer == tt.consumer) && len(want) < tt.limit {
				want = append(want, r.id)
			}
		}
		dls, err := idempotency.ListDeadLetters(ctx, s.Pool, tt.consumer, tt.limit)
		require.NoError(t, err)
		got := make([]int64, 0, len(dls))
		for _, d := range dls {
			got = append(got, d.ID)
		}
		require.Equal(t, want, got, "consumer %q, limit %d", tt.consumer, tt.limit)
	}
}

// Each status's branch of ListDeadLetters' query is an ordered scan of an
// index of open dead letters (migration 00020), stopped at the limit:
// never a sort of every open row.
func TestListDeadLettersReadsOpenIndexes(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	conn, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `RESET enable_seqscan`) }()
	open := regexp.MustCompile(`Index Scan using dead_letters_open_(?:consumer_)?status_idx `)
	for _, byConsumer := range []bool{false, true} {
		rows, err := conn.Query(ctx, "EXPLAIN "+idempotency.ListDeadLettersSQL(byConsumer), pgx.NamedArgs{"consumer": "a", "limit": 50})
		require.NoError(t, err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		text := strings.Join(plan, "\n")
		require.Len(t, open.FindAllString(text, -1), 3, "by consumer %v:\n%s", byConsumer, text)
		require.NotContains(t, text, "Sort  (", "by consumer %v:\n%s", byConsumer, text)
	}
}

// ReadDeadLetterCounts counts each consumer's open dead letters by status;
// closed ones are not counted, and a consumer with none is absent.
func TestReadDeadLetterCounts(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	n := 0
	add := func(consumer, status string, count int) {
		for range count {
			n++
			_, err := s.Pool.Exec(ctx, `
				INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
				                          payload, metadata, status, reason)
				VALUES ($1, $2, 'e', 'acct', $3, 1, '\x7b7d', '{}', $4, 'failed')`,
				consumer, fmt.Sprintf("00000000-0000-0000-0000-%012d", n), fmt.Sprint(n), status)
			require.NoError(t, err)
		}
	}
	add("a", "held", 1)
	add("a", "retrying", 2)
	add("a", "dead", 3)
	add("a", "resolved", 4)
	add("b", "dead", 5)
	add("b", "discarded", 1)
	add("c", "resolved", 2)
	got, err := idempotency.ReadDeadLetterCounts(ctx, s.Pool)
	require.NoError(t, err)
	require.Equal(t, map[string]idempotency.DeadLetterCounts{"a": {Held: 1, Retrying: 2, Dead: 3}, "b": {Dead: 5}}, got)
}

// The counts can be read from an index of open dead letters alone
// (migration 00020), in the order of their groups, without a visit to
// each row. Sequential and bitmap scans off: an empty table's statistics
// make any plan look as cheap.
func TestReadDeadLetterCountsIndexOnly(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	conn, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET enable_seqscan = off; SET enable_bitmapscan = off`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `RESET enable_seqscan; RESET enable_bitmapscan`) }()
	rows, err := conn.Query(ctx, "EXPLAIN "+idempotency.DeadLetterCountsSQL)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "Index Only Scan using dead_letters_open_consumer_status_idx", strings.Join(plan, "\n"))
}

// RetryDeadLetter finds a dead letter by an id past 2^31: dead_letters.id
// is a bigint, and the statement must not type its parameter as an integer.
func TestRetryDeadLetterByAnIDPastInt32(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `ALTER TABLE dead_letters ALTER COLUMN id RESTART WITH 3000000000`)
	require.NoError(t, err)
	var id int64
	require.NoError(t, s.Pool.QueryRow(ctx, `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
		                          payload, metadata, status, reason)
		VALUES ('c', gen_random_uuid(), 'e', 'acct', '1', 1, '\x7b7d', '{}', 'dead', 'failed') RETURNING id`).Scan(&id))
	n, err := idempotency.RetryDeadLetter(ctx, s.Pool, "", id)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}
