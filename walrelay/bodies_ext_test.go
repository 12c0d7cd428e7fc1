package walrelay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/walrelay"
)

type document struct {
	Content string `json:"content"`
}

func (document) EventType() string { return "document.scanned" }

// WAL mode: the outbox holds no row of an event, so only the slot knows
// whether it was relayed. After an outage, a body older than the
// retention whose event the slot has not confirmed stays; it goes once
// the event was relayed.
func TestBodyOfAnUnrelayedEventOutlivesTheRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	// The running relay keeps no history, so runs no purge of its own: the
	// test's purger is the only one, its first run after the event's
	// commit (whose body's created_at the test moves back).
	e.run(e.config(func(c *walrelay.Config) { c.HistoryRetention = -1 }))
	e.broker.setDown(true)

	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "docs"}, Mode: outbox.ModeWAL,
		ClaimCheck: outbox.ClaimCheck{Threshold: 1024}})
	require.NoError(t, err)
	ev, err := events.New(ctx, events.Aggregate{Type: "document", ID: "d1", Version: 1}, document{Content: strings.Repeat("x", 5000)})
	require.NoError(t, err)
	tx, err := e.pg.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, tx, ev))
	require.NoError(t, tx.Commit(ctx))
	// Written 20 days ago, as if the relay had been down since.
	_, err = e.pg.Pool.Exec(ctx, `UPDATE outflow_claim_bodies SET created_at = now() - interval '20 days' WHERE message_id = $1`, ev.MessageID)
	require.NoError(t, err)
	bodies := func() int {
		return e.count(`SELECT count(*) FROM outflow_claim_bodies WHERE message_id = $1`, ev.MessageID)
	}

	purge, err := walrelay.BodiesPurger(e.config())
	require.NoError(t, err)
	outflowtest.WaitFor(t, 20*time.Second, "the broker tried the event", func() bool { return e.broker.offers(ev.MessageID) >= 2 })
	for range 3 {
		require.NoError(t, purge(ctx, time.Now()))
		require.Equal(t, 1, bodies(), "the slot has not confirmed its event: the body stays past the retention")
	}

	e.broker.setDown(false)
	outflowtest.WaitFor(t, 20*time.Second, "the event relayed", func() bool { return e.broker.has(ev.MessageID) })
	outflowtest.WaitFor(t, 20*time.Second, "the body purged once the slot confirmed past an earlier run", func() bool {
		require.NoError(t, purge(ctx, time.Now()))
		return bodies() == 0
	})
}
