package handlers_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// NATS loses what it acknowledged between the forwarder's publish and the
// consumers' reads: the stream is deleted and created again (as an
// operator would, with the same settings), the consumers absent (their
// workers start after the loss) or present (running, cut off from NATS
// while the forwarder publishes, back after the loss). With the audit on,
// every check of the end-to-end suite holds; with it off, the same failure
// loses events for good: the test proves something.
func TestNATSLossRepaired(t *testing.T) {
	t.Parallel()
	for _, present := range []bool{false, true} {
		for _, audit := range []bool{true, false} {
			name := "consumers absent"
			if present {
				name = "consumers present"
			}
			if audit {
				name += ", audit on"
			} else {
				name += ", audit off"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				natsLoss(t, present, audit)
			})
		}
	}
}

func natsLoss(t *testing.T, present, audit bool) {
	srv := testservers.StartNATS(t)
	proxy := testservers.StartProxy(t, srv.URL[len("nats://"):])
	p := newPipeline(t)
	// The workers connect through the proxy; the forwarder directly.
	p.backend = openBackend(t, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2, NATS: brokers.NATSConfig{URL: "nats://" + proxy.Addr}})
	direct := openBackend(t, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2, NATS: brokers.NATSConfig{URL: srv.URL}})
	lose := func(t *testing.T) {
		// The loss: the stream deleted, and created again as it was.
		conn, err := nats.Connect(srv.URL)
		require.NoError(t, err)
		defer conn.Close()
		// The API's default wait is 5 s: on a machine busy with the rest
		// of the suite, recreating the stream took longer once.
		js, err := conn.JetStream(nats.MaxWait(30 * time.Second))
		require.NoError(t, err)
		info, err := js.StreamInfo(app.PaymentsTopic)
		require.NoError(t, err)
		require.NoError(t, js.DeleteStream(app.PaymentsTopic))
		outflowtest.WaitFor(t, 10*time.Second, "the deleted stream's files removed", func() bool { return !srv.StreamStored(app.PaymentsTopic) })
		// Asked again when the API does not answer in time: once, under
		// the whole suite's load, the create waited past the 30 s above
		// (the server's own, started for this test). A create of the
		// same configuration is idempotent.
		outflowtest.WaitFor(t, 2*time.Minute, "the stream created again", func() bool {
			// nats-server 2.9.10 (this machine's) can panic when a message
			// read (the audit's) races the stream's deletion: the stream
			// is as lost as this test wants, and the server is started
			// again, as its supervisor would (docs/broker-loss.md).
			if srv.Crashed() {
				t.Logf("nats-server crashed; started again. The end of its log:\n%s", srv.Log())
				srv.Start()
			}
			_, err := js.AddStream(&info.Config)
			if err != nil {
				t.Logf("create the stream again: %v", err)
			}
			return err == nil
		})
	}
	brokerLoss{direct: direct, cut: proxy.Stop, uncut: proxy.Start, lose: lose}.run(t, p, present, audit)
}
