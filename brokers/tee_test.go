package brokers_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func open(t *testing.T, cfg brokers.Config) brokers.Backend {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	b, err := brokers.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func openKafka(t *testing.T) brokers.Backend {
	return open(t, brokers.Config{Kind: brokers.Kafka, Kafka: brokers.KafkaConfig{Brokers: testservers.Kafka(t), TopicPartitions: 4}})
}

func openNATS(t *testing.T) brokers.Backend {
	return open(t, brokers.Config{Kind: brokers.NATS, NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: testservers.NATSPrefix(t)}})
}

func testOutgoing(topic, aggregate string) forwarder.Outgoing {
	return forwarder.Outgoing{Topic: topic, AggregateID: aggregate, Message: message.NewMessage(watermill.NewUUID(), []byte("{}"))}
}

// A Tee of Redis and Kafka keeps the contract, read on its Redis side: a
// row over Kafka's record limit reaches neither side (without the check
// before sending, Redis would get a copy at every attempt), and either
// side's outage is the Tee's.
func TestTeeBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target {
			prefix := testservers.UniqueName(t, testservers.Redis(t)) + "_"
			target := brokertest.BackendTarget(t, open(t, brokers.Config{Kind: brokers.Redis,
				Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}}))
			target.Broker = brokers.Tee(target.Broker, openKafka(t).Broker())
			return target
		},
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			srv := testservers.StartRedis(t)
			target := brokertest.BackendTarget(t, open(t, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: srv.URL}}))
			target.Broker = brokers.Tee(openKafka(t).Broker(), target.Broker)
			return target, srv
		},
	})
}

// A Tee's limit is its tighter side's: a message is over it exactly when it
// is over one side's own limit, each side counting its own way.
func TestTeeLimitIsTheTighterSide(t *testing.T) {
	t.Parallel()
	k := openKafka(t)
	n := openNATS(t)
	kl := k.Broker().(forwarder.PayloadLimiter)
	nl := n.Broker().(forwarder.PayloadLimiter)
	tl, ok := brokers.Tee(k.Broker(), n.Broker()).(forwarder.PayloadLimiter)
	require.True(t, ok)
	require.Equal(t, min(kl.MaxMessageBytes(), nl.MaxMessageBytes()), tl.MaxMessageBytes())

	over := func(l forwarder.PayloadLimiter, m forwarder.Outgoing) bool {
		return l.MessageBytes(m) > l.MaxMessageBytes()
	}
	sawOnlyOne := false
	for size := tl.MaxMessageBytes() - 600; size <= tl.MaxMessageBytes(); size += 7 {
		m := testOutgoing("orders", "agg-1")
		m.Message.Payload = []byte(strings.Repeat("x", size))
		require.Equal(t, over(kl, m) || over(nl, m), over(tl, m), "payload of %d bytes", size)
		sawOnlyOne = sawOnlyOne || over(kl, m) != over(nl, m)
	}
	require.True(t, sawOnlyOne, "the range holds messages over one side's limit only")

	// A side with a far larger limit (Redis: proto-max-bulk-len, 512 MB by
	// default) leaves the other's.
	rb := open(t, brokers.Config{Kind: brokers.Redis})
	rl, ok := rb.Broker().(forwarder.PayloadLimiter)
	require.True(t, ok)
	require.Greater(t, rl.MaxMessageBytes(), kl.MaxMessageBytes())
	require.Equal(t, kl.MaxMessageBytes(), brokers.Tee(rb.Broker(), k.Broker()).(forwarder.PayloadLimiter).MaxMessageBytes())
}

// shortBroker is a real broker that loses its results: it publishes, then
// answers for none of the messages.
type shortBroker struct{ forwarder.Broker }

func (s shortBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	_ = s.Broker.Publish(ctx, msgs)
	return nil
}

// A Tee side that answers for fewer messages than it was given did not
// acknowledge the rest: the Tee must not report them published.
func TestTeeCountsAMissingResultAsUnavailable(t *testing.T) {
	t.Parallel()
	rc := testservers.Redis(t)
	prefix := testservers.UniqueName(t, rc)
	rb := open(t, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{StreamPrefix: prefix}})
	msgs := []forwarder.Outgoing{testOutgoing("tee", "a"), testOutgoing("tee", "b")}
	for _, tee := range []forwarder.Broker{brokers.Tee(rb.Broker(), shortBroker{rb.Broker()}), brokers.Tee(shortBroker{rb.Broker()}, rb.Broker())} {
		errs := tee.Publish(context.Background(), msgs)
		require.Len(t, errs, len(msgs))
		for _, err := range errs {
			require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
		}
	}
}
