package outbox_test

import (
	"context"
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/nats"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// receipt is a payload of any size: a body that may outgrow the broker.
type receipt struct {
	Lines []int  `json:"lines"`
	Note  string `json:"note"`
}

func (receipt) EventType() string { return "invoice.receipt" }

func receiptEvent(t *testing.T, aggID string, version int64, lines int, note string) events.Event {
	t.Helper()
	ev, err := events.New(context.Background(), events.Aggregate{Type: invoiceAggregate, ID: aggID, Version: version},
		receipt{Lines: make([]int, lines), Note: note})
	require.NoError(t, err)
	// In microseconds, as PostgreSQL keeps it (the size the writer counts
	// is then exactly the forwarder's), and no trailing zero, which the
	// RFC 3339 form would drop: every event's metadata has one size.
	ev.OccurredAt = time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	return ev
}

// PostgreSQL's jsonb text is what the forwarder publishes; the writer's
// count of it must be PostgreSQL's own.
func TestJSONBTextLenIsPostgreSQLs(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	marshal := func(v any) string {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return string(b)
	}
	for _, p := range []string{
		`{}`, `[]`, `null`, `true`, `"x"`, `0`, `-0`, `-0.0`, `1.50`, `1e3`, `1E+3`, `-2.5e-3`, `12.30e1`, `0e9`,
		`1.5e2`, `123456789012345678901234567890`, `[1,2,3]`, `{"a":1,"b":[true,false,null],"c":{}}`,
		` { "spaced" : [ 1 , 2 ] } `, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u0001\u001f"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`,
		`"é中😀"`, `{"a":1,"a":2}`,
		marshal(map[string]any{"html": "<a href='x'>&</a>", "sep": "\u2028\u2029", "n": []float64{1e21, 1e-7, 0.1, 3}}),
		marshal(receipt{Lines: make([]int, 100), Note: "line, after: line"}),
	} {
		var want int
		require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT octet_length($1::jsonb::text)`, p).Scan(&want), p)
		got := outbox.JSONBTextLen([]byte(p))
		if strings.Contains(p, `"a":1,"a":2`) {
			require.GreaterOrEqual(t, got, want, "duplicate keys are counted long: %s", p)
			continue
		}
		require.Equal(t, want, got, "%s", p)
	}
}

// forwardedSize is the size of the row's message as the forwarder builds
// and counts it against MaxEventBytes: payload plus metadata.
func forwardedSize(t *testing.T, s *outflowtest.Schema, messageID string) int {
	t.Helper()
	var r forwarder.Row
	require.NoError(t, s.Pool.QueryRow(context.Background(), `
		SELECT message_id::text, aggregate_type, aggregate_id, aggregate_version, event_type, payload::text, metadata::text, occurred_at
		FROM outbox WHERE message_id = $1`, messageID).Scan(&r.MessageID, &r.AggregateType, &r.AggregateID,
		&r.AggregateVersion, &r.EventType, &r.Payload, &r.Metadata, &r.OccurredAt))
	msg, err := forwarder.Message(r)
	require.NoError(t, err)
	n := len(msg.Payload)
	for k, v := range msg.Metadata {
		n += len(k) + len(v)
	}
	return n
}

func tooLarge(t *testing.T, err error) *outbox.EventTooLargeError {
	t.Helper()
	require.ErrorIs(t, err, outbox.ErrEventTooLarge)
	var tl *outbox.EventTooLargeError
	require.True(t, errors.As(err, &tl), "%v", err)
	return tl
}

// The writer counts what the forwarder will publish (jsonb's text of the
// payload, wider than json.Marshal's), to the byte: an event of exactly
// MaxEventBytes passes, one byte less refuses it and names size and limit.
func TestMaxEventBytesCountsWhatTheForwarderPublishes(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	unlimited, err := outbox.NewWriter(outbox.Config{MaxEventBytes: -1})
	require.NoError(t, err)
	ev := receiptEvent(t, uuid.NewString(), 1, 3000, `<b>"ok"</b>`)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return unlimited.PublishTx(ctx, tx, ev) }))
	size := forwardedSize(t, s, ev.MessageID)
	msg, err := ev.Message(ctx)
	require.NoError(t, err)
	require.Greater(t, size, len(msg.Payload)+2000, "jsonb's text is wider than the written payload (\", \" between numbers)")

	exact, err := outbox.NewWriter(outbox.Config{MaxEventBytes: size})
	require.NoError(t, err)
	under, err := outbox.NewWriter(outbox.Config{MaxEventBytes: size - 1})
	require.NoError(t, err)
	again := receiptEvent(t, ev.AggregateID, 2, 3000, `<b>"ok"</b>`)
	again.OccurredAt = ev.OccurredAt // same length of occurred_at
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return under.PublishTx(ctx, tx, again) })
	tl := tooLarge(t, err)
	require.Equal(t, size, tl.Size)
	require.Equal(t, size-1, tl.Limit)
	require.False(t, tl.Broker)
	require.Contains(t, err.Error(), fmt.Sprintf("is %d bytes (payload and metadata), over MaxEventBytes %d", size, size-1))
	require.Contains(t, err.Error(), "invoice.receipt event of "+invoiceAggregate+" "+ev.AggregateID)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return exact.PublishTx(ctx, tx, again) }))
	require.Equal(t, 2, countRows(t, s))
}

// Each way of writing refuses an oversized event before writing anything
// of the call, and the transaction goes on: the business row commits
// without the outbox row.
func TestOversizedEventRefusedInsideTheTransaction(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `CREATE TABLE invoices (id text PRIMARY KEY)`)
	require.NoError(t, err)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"invoice.receipt": "receipts", "*": "payments"}, MaxEventBytes: 4096})
	require.NoError(t, err)
	db := s.OpenLibPQ(t)

	small := func(id string) events.Event { return receiptEvent(t, id, 1, 10, "") }
	big := func(id string) events.Event { return receiptEvent(t, id, 2, 3000, "") }
	pgxWays := map[string]func(tx pgx.Tx, id string) error{
		"PublishTx": func(tx pgx.Tx, id string) error {
			// The small event, first and on another topic, is not written
			// either: the call is refused whole.
			return w.PublishTx(ctx, tx, newEvent(t, ctx, id, 1), big(id))
		},
		"WriteTx": func(tx pgx.Tx, id string) error {
			return w.WriteTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: id, Version: 2}, receipt{Lines: make([]int, 3000)})
		},
		"QueueTx": func(tx pgx.Tx, id string) error {
			b := &pgx.Batch{}
			if err := w.QueueTx(ctx, tx, b, small(id), big(id)); err != nil {
				return err
			}
			return tx.SendBatch(ctx, b).Close()
		},
	}
	for name, write := range pgxWays {
		t.Run(name, func(t *testing.T) {
			id := uuid.NewString()
			var writeErr error
			require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ($1)`, id); err != nil {
					return err
				}
				writeErr = write(tx, id)
				require.Equal(t, 4096, tooLarge(t, writeErr).Limit)
				return nil // the caller's choice: commit without the event
			}))
			var n int
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE id = $1`, id).Scan(&n))
			require.Equal(t, 1, n, "the business row committed")
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregate_id = $1`, id).Scan(&n))
			require.Zero(t, n, "no outbox row")
		})
	}
	stdWays := map[string]func(tx *stdsql.Tx, id string) error{
		"PublishStdTx": func(tx *stdsql.Tx, id string) error { return w.PublishStdTx(ctx, tx, small(id), big(id)) },
		"WriteStdTx": func(tx *stdsql.Tx, id string) error {
			return w.WriteStdTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: id, Version: 2}, receipt{Lines: make([]int, 3000)})
		},
	}
	for name, write := range stdWays {
		t.Run(name, func(t *testing.T) {
			id := uuid.NewString()
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `INSERT INTO invoices VALUES ($1)`, id)
			require.NoError(t, err)
			tooLarge(t, write(tx, id))
			require.NoError(t, w.PublishStdTx(ctx, tx, small(id)), "the transaction goes on")
			require.NoError(t, tx.Commit())
			var n int
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE id = $1`, id).Scan(&n))
			require.Equal(t, 1, n)
			require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregate_id = $1`, id).Scan(&n))
			require.Equal(t, 1, n, "only the small event")
		})
	}
}

// ModeWAL measures and refuses the same way, before emitting anything.
func TestWALModeRefusesOversizedEvent(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Mode: outbox.ModeWAL, MaxEventBytes: 4096})
	require.NoError(t, err)
	id := uuid.NewString()
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		tl := tooLarge(t, w.PublishTx(ctx, tx, receiptEvent(t, id, 1, 10, ""), receiptEvent(t, id, 2, 3000, "")))
		require.Equal(t, 4096, tl.Limit)
		// Compact in WAL mode: two bytes a line plus the envelope.
		require.Less(t, tl.Size, 3*3000)
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err // the transaction is untouched
	}))
}

// The broker's own limit is the ceiling: read from the NATS server's
// max_payload, it lowers the default, refuses a MaxEventBytes above it by
// name, and refuses an event the broker would refuse with its headers
// counted, which the forwarder would park.
func TestBrokerLimitIsTheCeiling(t *testing.T) {
	t.Parallel()
	srv := testservers.StartNATSConfig(t, "max_payload: 4096\n")
	ctx := context.Background()
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.NATS, NATS: brokers.NATSConfig{URL: srv.URL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })
	require.Equal(t, 4096, backend.Broker().(forwarder.PayloadLimiter).MaxMessageBytes(), "max_payload from the server's INFO")

	_, err = outbox.NewWriter(outbox.Config{Broker: backend.Broker(), MaxEventBytes: 8192})
	require.ErrorContains(t, err, "MaxEventBytes: 8192 is above the broker's limit of 4096 bytes")

	w, err := outbox.NewWriter(outbox.Config{Broker: backend.Broker()})
	require.NoError(t, err, "the default lowers itself to the broker's limit")
	s := outflowtest.NewSchema(t)

	// Find the largest note that fits MaxEventBytes (4096, payload and
	// metadata, the CloudEvents attributes the broker adds included); NATS
	// counts more (its header framing, Nats-Msg-Id and Watermill's uuid
	// header), so the broker's limit applies to it.
	id := uuid.NewString()
	measure, err := outbox.NewWriter(outbox.Config{Broker: backend.Broker(), MaxEventBytes: 1})
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return measure.PublishTx(ctx, tx, receiptEvent(t, id, 1, 0, strings.Repeat("n", 3000)))
	})
	note := 3000 + 4096 - tooLarge(t, err).Size // payload and metadata: 4096 bytes
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return w.PublishTx(ctx, tx, receiptEvent(t, id, 1, 0, strings.Repeat("n", note)))
	})
	tl := tooLarge(t, err)
	require.True(t, tl.Broker, "the broker's count applied: %v", err)
	require.Equal(t, 4096, tl.Limit)
	require.Contains(t, err.Error(), "over the broker's limit of 4096 bytes")

	// What the writer takes, the forwarder sends: an event just under the
	// broker's count arrives, none is parked.
	fits := note - (tl.Size - tl.Limit)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return w.PublishTx(ctx, tx, receiptEvent(t, id, 1, 0, strings.Repeat("n", fits)))
	}))
	// An event written before the limit (by a writer without one) that
	// the broker cannot take is parked at its first attempt, saying why.
	old := uuid.NewString()
	noLimit, err := outbox.NewWriter(outbox.Config{MaxEventBytes: -1})
	require.NoError(t, err)
	oversized := receiptEvent(t, old, 1, 0, strings.Repeat("n", note))
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return noLimit.PublishTx(ctx, tx, oversized) }))
	fwd, err := forwarder.New(forwarder.Config{Pool: s.Pool, Broker: backend.Broker(), PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fwd.Run(fctx) }()
	t.Cleanup(func() { stop(); <-done })
	outflowtest.WaitFor(t, 30*time.Second, "the event that fits forwarded, the old one parked", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE state = 'published'`).Scan(&n))
		parked, err := forwarder.ListParked(ctx, s.Pool, 10)
		require.NoError(t, err)
		return n == 1 && len(parked) == 1
	})
	parked, err := forwarder.ListParked(ctx, s.Pool, 10)
	require.NoError(t, err)
	require.Equal(t, oversized.MessageID, parked[0].MessageID, "only the event written without a limit is parked")
	require.Equal(t, 1, parked[0].Attempts, "parked at once: no retry makes it fit")
	require.Contains(t, parked[0].LastError, "over the broker's limit of 4096 bytes")
}

// shrinkingLimit is a broker whose limit drops at each read, as a broker's
// does when it reconnects to a server with a lower max_payload.
type shrinkingLimit struct{ max int }

func (*shrinkingLimit) Publish(context.Context, []forwarder.Outgoing) []error { return nil }
func (b *shrinkingLimit) MaxMessageBytes() int                                { b.max /= 2; return b.max }
func (*shrinkingLimit) MessageBytes(forwarder.Outgoing) int                   { return 0 }

// The writer reads its broker's limit once: a default taken from one read
// is never refused by the next, which would fail NewWriter over a setting
// nobody set.
func TestBrokerLimitReadOnce(t *testing.T) {
	t.Parallel()
	b := &shrinkingLimit{max: 8192}
	_, err := outbox.NewWriter(outbox.Config{Broker: b})
	require.NoError(t, err)
	require.Equal(t, 4096, b.max, "one read")
}
