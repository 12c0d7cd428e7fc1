package nats_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	_ "github.com/outflow-dev/outflow/brokers/nats"
	"github.com/outflow-dev/outflow/outflowtest"
)

func openBackend(t *testing.T, cfg brokers.Config) brokers.Backend {
	t.Helper()
	b, err := brokers.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func jetStream(t *testing.T) nats.JetStreamContext {
	t.Helper()
	conn, err := nats.Connect(outflowtest.NATSURL())
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
			prefix := outflowtest.NATSPrefix(t)
			target := brokertest.BackendTarget(t, openBackend(t, brokers.Config{Kind: brokers.NATS,
				NATS: brokers.NATSConfig{URL: outflowtest.NATSURL(), StreamPrefix: prefix}}))
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
		Outage: func(t *testing.T) (brokertest.Target, outflowtest.Outage) {
			srv := outflowtest.StartNATS(t)
			return brokertest.BackendTarget(t, openBackend(t, brokers.Config{Kind: brokers.NATS,
				NATS: brokers.NATSConfig{URL: srv.URL, PublishTimeout: 500 * time.Millisecond}})), srv
		},
	})
}
