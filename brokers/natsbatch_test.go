package brokers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// suitePublisher publishes through the backend's forwarder side, as the
// forwarder does; the suite's topic is the subject, prefix included.
type suitePublisher struct {
	b      brokers.Backend
	prefix string
}

func (p suitePublisher) Publish(topic string, msgs ...*message.Message) error {
	out := make([]forwarder.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = forwarder.Outgoing{Topic: strings.TrimPrefix(topic, p.prefix), AggregateID: m.UUID, Message: m}
	}
	for _, err := range p.b.Broker().Publish(context.Background(), out) {
		if err != nil {
			return err
		}
	}
	return nil
}

func (p suitePublisher) Close() error { return nil }

// Watermill's universal Pub/Sub suite on the NATS backend's subscriber
// (brokers.NATSSubscriber), with the features it honestly has: consumer
// groups, persistence, old messages for a new group; no order (a fetch is
// handled concurrently) and no exactly-once.
func TestNATSSubscriberUniversalSuite(t *testing.T) {
	prefix := outflowtest.NATSPrefix(t)
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.NATS,
			NATS: brokers.NATSConfig{URL: outflowtest.NATSURL(), StreamPrefix: prefix}})
		require.NoError(t, err)
		t.Cleanup(func() { b.Close() })
		sub, err := b.Subscriber(group, watermill.NewShortUUID(), brokers.SubscriberOptions{ClaimIdle: 2 * time.Second})
		require.NoError(t, err)
		return suitePublisher{b, prefix}, sub
	}
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:                   true,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: true,
		GenerateTopicFunc: func(tctx tests.TestContext) string {
			return prefix + string(tctx.TestID)[:8] + watermill.NewShortUUID()
		},
	},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "g"+watermill.NewShortUUID()) },
		newPubSub)
}
