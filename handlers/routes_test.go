package handlers_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/handlers"
)

// The reference handlers read the topic the payments service routes their
// events to, and list only registered types.
func TestReferenceHandlersMatchTheRoutes(t *testing.T) {
	t.Parallel()
	reg := events.NewRegistry()
	require.NoError(t, paymentevents.Register(reg))
	require.NoError(t, consumer.CheckRoutes(app.Routes, reg,
		handlers.SyncAnalytics(), handlers.NotifyMerchant(nil, handlers.NotifyConfig{})))
}
