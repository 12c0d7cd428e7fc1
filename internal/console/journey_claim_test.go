package console_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
)

type scannedDoc struct {
	DocumentID string `json:"document_id"`
	Content    string `json:"content"`
}

func (scannedDoc) EventType() string { return "document.scanned" }

// The journey shows that an event's body travels by reference, and its
// size, never the body: the console does not read outflow_claim_bodies.
func TestJourneyShowsABodyByReference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "payments"}, ClaimCheck: outbox.ClaimCheck{Threshold: 1024}})
	require.NoError(t, err)
	agg := "0190c0de-0000-7000-8000-0000000000cc"
	for v, size := range []int{100_000, 10} {
		ev, err := events.New(ctx, events.Aggregate{Type: "payment", ID: agg, Version: int64(v + 1)},
			scannedDoc{DocumentID: agg, Content: strings.Repeat("secret-body-", size/12+1)[:size]})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))
	}
	c := e.client(t)
	e.login(t, c)
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q="+agg, nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, 1, strings.Count(body, `class="by-reference"`), "the large event only")
	require.Contains(t, body, "by reference: 100,0")
	require.NotContains(t, body, "secret-body-secret-body", "the body is never on the page")
}
