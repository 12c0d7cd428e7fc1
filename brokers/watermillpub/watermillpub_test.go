package watermillpub_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	redisbackend "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/brokers/watermillpub"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// refusing is a real publisher that refuses, as the message's fault, what
// is over a size on one topic until allowed: a broker's own per-message
// refusal, which Redis does not have.
type refusing struct {
	message.Publisher
	mu      sync.Mutex
	topic   string
	over    int
	refused atomic.Int64
}

var errTooLarge = errors.New("message too large")

func (r *refusing) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	t, over := r.topic, r.over
	r.mu.Unlock()
	for _, m := range msgs {
		if topic == t && over > 0 && len(m.Payload) > over {
			r.refused.Add(1)
			return fmt.Errorf("%w: %d bytes", errTooLarge, len(m.Payload))
		}
	}
	return r.Publisher.Publish(topic, msgs...)
}

// target is the adapter over watermill-redisstream's publisher on url's
// Redis, read by the redis backend's subscriber on the same streams.
func target(t *testing.T, url string) brokertest.Target {
	t.Helper()
	prefix := testservers.UniqueName(t, testservers.Redis(t)) + "_"
	client, err := redisbackend.NewClient(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref := &refusing{Publisher: pub}
	broker, err := watermillpub.New(watermillpub.Config{Publisher: ref,
		Topic: func(m forwarder.Outgoing) string { return prefix + m.Topic }})
	if err != nil {
		t.Fatal(err)
	}
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.Redis,
		Redis: brokers.RedisConfig{URL: url, StreamPrefix: prefix}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	tg := brokertest.BackendTarget(t, b)
	tg.Broker = broker
	tg.Refuse = func(t *testing.T, topic string, bytes int) func() {
		ref.mu.Lock()
		ref.topic, ref.over = prefix+topic, bytes
		ref.mu.Unlock()
		return func() {
			ref.mu.Lock()
			ref.over = 0
			ref.mu.Unlock()
			if ref.refused.Load() == 0 {
				t.Error("the publisher refused nothing: the refusal was not exercised")
			}
		}
	}
	return tg
}

func TestBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target { return target(t, testservers.RedisURL()) },
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			srv := testservers.StartRedis(t)
			return target(t, srv.URL), srv
		},
	})
}

// With MaxMessageBytes the adapter is a PayloadLimiter, counting payload
// and metadata; without it, it is not.
func TestLimitOnlyWhenTold(t *testing.T) {
	pub := &refusing{}
	b, err := watermillpub.New(watermillpub.Config{Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.(forwarder.PayloadLimiter); ok {
		t.Fatal("a limit nobody set")
	}
	b, err = watermillpub.New(watermillpub.Config{Publisher: pub, MaxMessageBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	lim := b.(forwarder.PayloadLimiter)
	m := message.NewMessage("id", []byte("12345"))
	m.Metadata.Set("ab", "cde")
	if got := lim.MessageBytes(forwarder.Outgoing{Message: m}); got != 10 || lim.MaxMessageBytes() != 100 {
		t.Fatalf("MessageBytes = %d, MaxMessageBytes = %d; want 10, 100", got, lim.MaxMessageBytes())
	}
}
