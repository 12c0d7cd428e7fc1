package nats_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	_ "github.com/outflow-dev/outflow/brokers/nats"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

func openBackend(t *testing.T, cfg brokers.Config) brokers.Backend {
	t.Helper()
	// Bounded: a cluster without a meta leader would not answer the
	// open's JetStream request.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := brokers.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func jetStream(t *testing.T) nats.JetStreamContext {
	t.Helper()
	conn, err := nats.Connect(testservers.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	js, err := conn.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// JetStream refuses a message on its own when it is over its stream's
// MaxMsgSize (below max_payload and the forwarder's limit).
func TestBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target {
			prefix := testservers.NATSPrefix(t)
			target := brokertest.BackendTarget(t, openBackend(t, brokers.Config{Kind: brokers.NATS,
				NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}}))
			target.Refuse = func(t *testing.T, topic string, bytes int) func() {
				js := jetStream(t)
				stream := prefix + topic // no dots: the stream is named as its subject
				if _, err := js.AddStream(&nats.StreamConfig{Name: stream, Subjects: []string{prefix + topic, prefix + topic + ".*"},
					Storage: nats.FileStorage, Replicas: 1, Retention: nats.LimitsPolicy, MaxMsgSize: int32(bytes)}); err != nil {
					t.Fatal(err)
				}
				return func() {
					info, err := js.StreamInfo(stream)
					if err != nil {
						t.Fatal(err)
					}
					cfg := info.Config
					cfg.MaxMsgSize = -1
					if _, err := js.UpdateStream(&cfg); err != nil {
						t.Fatal(err)
					}
				}
			}
			return target
		},
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			srv := testservers.StartNATS(t)
			return brokertest.BackendTarget(t, openBackend(t, brokers.Config{Kind: brokers.NATS,
				NATS: brokers.NATSConfig{URL: srv.URL, PublishTimeout: 500 * time.Millisecond}})), srv
		},
	})
}

// Lag and Ping, on two partitions (two subjects of one stream); the outage
// is a nats-server of the test's own.
func TestObserveContract(t *testing.T) {
	t.Parallel()
	brokertest.RunObserve(t, brokertest.ObserveHarness{
		CountsUnacked: true,
		Open: func(t *testing.T) brokers.Backend {
			return openBackend(t, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2,
				NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: testservers.NATSPrefix(t)}})
		},
		Outage: func(t *testing.T) (brokers.Backend, testservers.Outage) {
			srv := testservers.StartNATS(t)
			return openBackend(t, brokers.Config{Kind: brokers.NATS, NATS: brokers.NATSConfig{URL: srv.URL}}), srv
		},
	})
}

// A group whose durable consumer does not exist yet will read the whole
// subject: it lags by all of it. Asking creates nothing.
func TestLagOfAGroupNotSubscribedYet(t *testing.T) {
	t.Parallel()
	prefix := testservers.NATSPrefix(t)
	b := openBackend(t, brokers.Config{Kind: brokers.NATS,
		NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}})
	lr := b.(brokers.LagReporter)
	ctx := context.Background()
	lag, err := lr.Lag(ctx, "g", "orders")
	if err != nil || lag != (brokers.Lag{}) {
		t.Fatalf("no stream yet: got %+v, %v; want zero", lag, err)
	}
	if _, err := jetStream(t).StreamInfo(prefix + "orders"); err == nil {
		t.Fatal("Lag created the stream")
	}
	var msgs []forwarder.Outgoing
	for i := range 3 {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		msgs = append(msgs, forwarder.Outgoing{Topic: "orders", AggregateID: fmt.Sprint(i), Message: m})
	}
	for _, err := range b.Broker().Publish(ctx, msgs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	outflowtest.WaitFor(t, 10*time.Second, "3 events lagging, older than 0", func() bool {
		lag, err = lr.Lag(ctx, "g", "orders")
		if err != nil {
			t.Fatal(err)
		}
		return lag.Events == 3 && lag.OldestAge > 0
	})
	if _, err := jetStream(t).ConsumerInfo(prefix+"orders", "g_"+prefix+"orders"); !errors.Is(err, nats.ErrConsumerNotFound) {
		t.Fatalf("Lag created the consumer (or: %v)", err)
	}
}
