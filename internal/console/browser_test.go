package console_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
)

// seeded is what the browser tests find in the stack: payments forwarded
// and handled, two parked outbox rows and the dead letters of one payment.
type seeded struct {
	merchantID string
	parked     string // the payment whose rows the broker refused, to retry
	discard    string // another one, to discard
	dead       string // the payment the ledger-export consumer fails
}

// seed makes payments, parks two (the broker refuses their aggregates and
// the forwarder gives up after one attempt) and dead-letters another (a
// consumer fails its events), and waits until the pipeline shows them all.
func (s *stack) seed(t *testing.T) seeded {
	t.Helper()
	ctx := context.Background()
	m := s.merchant(t)
	out := seeded{merchantID: m.ID}
	for i := range 5 {
		s.pay(t, m.ID, int64(1000+i))
	}
	// The ids are known only once created: create, then mark, before paying.
	dead := s.pay(t, m.ID, 4242)
	out.dead = dead.ID
	s.mu.Lock()
	s.failFor[dead.ID] = true
	s.mu.Unlock()
	s.api(t, "/v1/payments/"+dead.ID+"/refund", `{}`)

	pending := s.create(t, m.ID, 777)
	out.parked = pending.ID
	s.broker.setRefused(pending.ID, true)
	s.api(t, "/v1/payments/"+pending.ID+"/pay", `{}`)
	pool := s.schema.Pool
	// Refused once created and forwarded: its payment.paid is what parks,
	// the event the merchant would be notified of.
	toDiscard := s.create(t, m.ID, 888)
	out.discard = toDiscard.ID
	outflowtest.WaitFor(t, 30*time.Second, "the payment to discard forwarded", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox JOIN outbox_state s USING (id) WHERE aggregate_id = $1 AND s.published`,
			out.discard).Scan(&n))
		return n == 1
	})
	s.broker.setRefused(toDiscard.ID, true)
	s.api(t, "/v1/payments/"+toDiscard.ID+"/pay", `{}`)

	outflowtest.WaitFor(t, 30*time.Second, "a parked outbox row of each refused payment", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT aggregate_id) FROM outbox_failures
			WHERE aggregate_id = ANY($1) AND parked_at IS NOT NULL`, []string{out.parked, out.discard}).Scan(&n))
		return n == 2
	})
	// Dead, not still retrying: the overview must show a settled count.
	outflowtest.WaitFor(t, 30*time.Second, "a dead letter of ledger-export", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx,
			`SELECT count(*) FROM dead_letters WHERE consumer = 'ledger-export' AND status = 'dead'`).Scan(&n))
		return n > 0
	})
	return out
}

// checkHarness checks the harness itself, on TestConsoleInBrowser's stack
// and tab (a stack and a browser of its own cost the package as much as
// the operator's path does): the stack parked a row and made a dead letter
// (seed waited for both), and the browser loads a page of the stack and
// screenshots it.
func checkHarness(t *testing.T, ctx context.Context, s *stack) {
	dir := artifactsDir(t)
	run(t, ctx, "load the API's /healthz",
		chromedp.Navigate(s.apiSrv.URL+"/healthz"),
		chromedp.WaitVisible(chromedp.CSS("body")),
	)
	body, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
	require.NoError(t, err)
	require.True(t, strings.Contains(body, "ok"), "healthz page: %q", body)
	path := screenshot(t, ctx, dir, "healthz")
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Positive(t, st.Size())
}
