package walrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/walrelay"
)

// The WAL relay publishes through the backend's Broker, as the forwarder
// does: its messages carry the CloudEvents attributes in the broker's
// binding (here Redis's ce_ fields). brokers/cloudevents reads them with
// the CloudEvents SDK.
func TestRelayedMessagesCarryCloudEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testservers.Redis(t)
	b, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: testservers.UniqueName(t, client)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	e := setup(t)
	e.run(e.config(func(c *walrelay.Config) { c.Broker = b.Broker() }))
	ev := e.event("a", 1)
	e.write(ev)

	stream := b.Topics("orders")[0]
	outflowtest.WaitFor(t, 20*time.Second, "the relayed event on the stream", func() bool {
		n, err := client.XLen(ctx, stream).Result()
		require.NoError(t, err)
		return n == 1
	})
	entries, err := client.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	f := entries[0].Values
	require.Equal(t, ev.MessageID, f["ce_id"])
	require.Equal(t, "1.0", f["ce_specversion"])
	require.Equal(t, "order.placed", f["ce_type"])
	require.Equal(t, "a", f["ce_subject"])
	require.Equal(t, "urn:outflow", f["ce_source"])
	require.Equal(t, "application/json", f["content-type"])
	require.JSONEq(t, `{"n":1}`, f["payload"].(string))
}
