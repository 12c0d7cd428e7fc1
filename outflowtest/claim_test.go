package outflowtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

type scannedDoc struct {
	DocumentID string `json:"document_id"`
	Content    string `json:"content"`
}

func (scannedDoc) EventType() string { return "document.scanned" }

// The helpers cope with a body by reference: RequireEvent matches and
// shows the body (ByReference set), and the handler harness resolves the
// message the forwarder publishes, as a consumer.Worker does.
func TestHelpersResolveBodiesByReference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "docs"}, ClaimCheck: outbox.ClaimCheck{Threshold: 1024}})
	require.NoError(t, err)
	content := strings.Repeat("secret-body-", 1000)
	ev, err := events.New(ctx, events.Aggregate{Type: "document", ID: "d1", Version: 1}, scannedDoc{DocumentID: "d1", Content: content})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))

	got := outflowtest.RequireEvent(ctx, t, s.Pool, outflowtest.Want{Type: "document.scanned", Payload: map[string]any{"content": content}})
	require.True(t, got.ByReference)
	require.NotContains(t, got.Metadata, claimcheck.RefKey)
	reg := events.NewRegistry()
	require.NoError(t, reg.Register(scannedDoc{}))
	dec, err := got.Event(reg)
	require.NoError(t, err)
	require.Equal(t, content, dec.Payload.(scannedDoc).Content)

	// The message as the forwarder publishes it: the reference.
	var row forwarder.Row
	require.NoError(t, s.Pool.QueryRow(ctx, `
		SELECT message_id::text, aggregate_type, aggregate_id, aggregate_version, event_type, payload::text, metadata::text, occurred_at
		FROM outbox`).Scan(&row.MessageID, &row.AggregateType, &row.AggregateID, &row.AggregateVersion, &row.EventType,
		&row.Payload, &row.Metadata, &row.OccurredAt))
	msg, err := forwarder.Message(row)
	require.NoError(t, err)
	var seen string
	h := outflowtest.NewHandlerHarness(t, s.Pool, reg, consumer.Handler{Name: "docs", Topic: "docs",
		Func: func(_ context.Context, _ pgx.Tx, ev events.Event) error {
			seen = ev.Payload.(scannedDoc).Content
			return nil
		}})
	d := h.DeliverMessage(ctx, msg)
	require.Equal(t, outflowtest.Applied, d.Outcome, "%v", d.Err)
	require.Equal(t, content, seen)
}
