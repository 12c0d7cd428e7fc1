package handlers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/handlers"
)

// newSender is the previous release's webhook sender on p's database, for
// the handover's rollout tests only: no process of this release runs it.
func newSender(t *testing.T, p *pipeline, cfg handlers.NotifyConfig) *handlers.Sender {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	cfg.AllowPrivate = true // the merchants are httptest servers
	return handlers.NewSender(p.schema.Pool, cfg)
}

func withPoll(cfg handlers.NotifyConfig, every time.Duration) handlers.NotifyConfig {
	cfg.PollInterval = every
	return cfg
}

func merchant(t *testing.T, p *pipeline, name, url string) app.CreatedMerchant {
	t.Helper()
	m, err := p.svc.CreateMerchant(context.Background(), app.NewMerchant{Name: name, WebhookURL: url})
	require.NoError(t, err)
	return m
}

func count(t *testing.T, p *pipeline, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
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
