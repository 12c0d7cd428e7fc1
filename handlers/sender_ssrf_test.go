package handlers_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// loopbackResolver answers every name with 127.0.0.1: a merchant's name
// re-pointed at the service's own host after its URL was accepted (DNS
// rebinding).
type loopbackResolver struct{ lookups atomic.Int32 }

func (r *loopbackResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// strictService creates merchants as production does: https, public names.
func strictService(t *testing.T, p *pipeline) *app.Service {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: p.schema.Pool, Events: w})
	require.NoError(t, err)
	return svc
}

func fastRetries(cfg handlers.NotifyConfig) handlers.NotifyConfig {
	cfg.Logger, cfg.MaxAttempts = quiet, 2
	cfg.Backoff, cfg.BackoffMax, cfg.PollInterval = 10*time.Millisecond, 20*time.Millisecond, 10*time.Millisecond
	return cfg
}

type attemptRow struct {
	status, lastErr string
	errors          []string
}

func settledDelivery(t *testing.T, p *pipeline, id int64) attemptRow {
	t.Helper()
	var a attemptRow
	outflowtest.WaitFor(t, 10*time.Second, "the delivery settled dead", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND status = 'dead'`, id) == 1
	})
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `
		SELECT status, last_error, (SELECT array_agg(coalesce(error, '')) FROM webhook_attempts WHERE delivery_id = $1)
		FROM webhook_deliveries WHERE id = $1`, id).Scan(&a.status, &a.lastErr, &a.errors))
	return a
}

// A merchant on 127.0.0.1 is reached with AllowPrivate (local development,
// the tests) and refused without it, before any connection.
func TestSenderRefusesLoopbackUnlessAllowed(t *testing.T) {
	t.Parallel()
	p := newPipeline(t) // creates merchants with AllowPrivateWebhooks
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	m := merchant(t, p, "Local", srv.URL+"/hook")

	refused := record(t, p, m, 1)[0]
	s := handlers.NewSender(p.schema.Pool, fastRetries(handlers.NotifyConfig{}))
	stop := runStoppable(t, s.Run)
	a := settledDelivery(t, p, refused)
	stop()
	require.Contains(t, a.lastErr, "webhook URL refused")
	require.Len(t, a.errors, 1, "refused at once, not retried")
	require.Zero(t, hits.Load(), "no request reached the local server")

	allowed := record(t, p, m, 1)[0]
	run(t, handlers.NewSender(p.schema.Pool, fastRetries(handlers.NotifyConfig{AllowPrivate: true})).Run)
	outflowtest.WaitFor(t, 30*time.Second, "the allowed delivery settled", func() bool {
		return count(t, p, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND status <> 'pending'`, allowed) == 1
	})
	var status, lastErr string
	var attempts []string
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `
		SELECT status, coalesce(last_error, ''), coalesce((SELECT array_agg(coalesce(error, '') || ' ' || coalesce(status_code::text, ''))
		FROM webhook_attempts WHERE delivery_id = $1), '{}')
		FROM webhook_deliveries WHERE id = $1`, allowed).Scan(&status, &lastErr, &attempts))
	require.Equal(t, "delivered", status, "last error %q, attempts %q, hits %d", lastErr, attempts, hits.Load())
	require.Equal(t, int32(1), hits.Load())
}

// A name accepted at creation that resolves to a loopback address when the
// webhook is sent is refused at connect time, at every attempt, and the
// attempt records the category, not the address or the port.
func TestSenderRefusesANameThatResolvesPrivately(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	// The test certificate is valid for *.example.com: were the guard
	// absent, this request would be delivered.
	m, err := strictService(t, p).CreateMerchant(context.Background(),
		app.NewMerchant{Name: "Rebound", WebhookURL: "https://rebound.example.com:" + port + "/hook"})
	require.NoError(t, err, "a public-looking name is accepted at creation")
	id := record(t, p, m, 1)[0]

	res := &loopbackResolver{}
	run(t, handlers.NewSender(p.schema.Pool, fastRetries(handlers.NotifyConfig{Client: srv.Client(), Resolver: res})).Run)
	a := settledDelivery(t, p, id)
	require.Equal(t, "blocked: private address", a.lastErr)
	require.Equal(t, []string{"blocked: private address"}, a.errors)
	require.Zero(t, hits.Load())
	require.Positive(t, res.lookups.Load(), "resolved when sent")

	// localhost, stored by an older version (creation refuses it now), is
	// refused too.
	var local int64
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body)
		VALUES (gen_random_uuid(), $1, $2, 'payment.paid', '{}') RETURNING id`, m.ID, "https://localhost:"+port+"/hook").Scan(&local))
	require.Contains(t, settledDelivery(t, p, local).lastErr, "private")
	require.Zero(t, hits.Load())
}

// A refused connection is recorded as a category: whoever reads the
// attempts cannot tell which ports answer.
func TestSenderRecordsNoAddressInErrors(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	_, port, _ := net.SplitHostPort(addr)
	id := record(t, p, merchant(t, p, "Closed", "http://"+addr+"/hook"), 1)[0]
	run(t, handlers.NewSender(p.schema.Pool, fastRetries(handlers.NotifyConfig{AllowPrivate: true})).Run)
	a := settledDelivery(t, p, id)
	require.Equal(t, "connection refused or unreachable", a.lastErr)
	require.Len(t, a.errors, 2, "retried, as a network error is")
	for _, e := range append(a.errors, a.lastErr) {
		require.Equal(t, "connection refused or unreachable", e)
		require.NotContains(t, e, "127.0.0.1")
		require.NotContains(t, e, port)
	}
}

// runStoppable runs fn until the returned stop is called (or the test ends).
func runStoppable(t *testing.T, fn func(context.Context) error) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var stopped atomic.Bool
	stop := func() {
		if stopped.CompareAndSwap(false, true) {
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return stop
}
