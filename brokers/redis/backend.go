package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/redact"
)

func init() { brokers.Register(brokers.Redis, open) }

// DefaultURL is the Redis a [brokers.RedisConfig] with no URL connects to.
const DefaultURL = "redis://127.0.0.1:6379/0"

type backend struct {
	cfg    brokers.Config
	client goredis.UniversalClient
	broker *Broker
}

var _ brokers.TopicTrimmer = (*backend)(nil)

// open opens the redis backend of cfg (its Redis block), whose defaults
// [brokers.Open] has set.
func open(ctx context.Context, cfg brokers.Config) (brokers.Backend, error) {
	if cfg.Redis.URL == "" {
		cfg.Redis.URL = DefaultURL
	}
	client, err := connectTo(ctx, cfg.Redis)
	if err != nil {
		return nil, err // names Redis and the redacted URL
	}
	bc := Config{Client: client, StreamPartitions: cfg.StreamPartitions, StreamPrefix: cfg.Redis.StreamPrefix,
		WaitReplicas: cfg.Redis.WaitReplicas, WaitTimeout: cfg.Redis.WaitTimeout}
	if !cfg.CloudEvents.Disabled {
		bc.Marshaller = CloudEventsMarshaller{}
	}
	if bc.MaxFieldBytes, err = ProtoMaxBulkLen(ctx, client, cfg.Logger); err != nil {
		client.Close()
		return nil, fmt.Errorf("read proto-max-bulk-len of Redis at %s: %w", redact.URL(cfg.Redis.URL), err)
	}
	broker, err := New(bc)
	if err != nil {
		client.Close()
		return nil, err
	}
	return &backend{cfg: cfg, client: client, broker: broker}, nil
}

// connectTo connects as cfg says: to a Cluster when it says so.
func connectTo(ctx context.Context, cfg brokers.RedisConfig) (goredis.UniversalClient, error) {
	if cfg.Cluster {
		return NewClusterClient(ctx, cfg.URL)
	}
	return NewClient(ctx, cfg.URL)
}

func (b *backend) Kind() brokers.Kind { return brokers.Redis }
func (b *backend) Broker() forwarder.Broker {
	return brokers.WithCloudEvents(b.broker, cloudevents.Redis, b.cfg.CloudEvents)
}

// BrokerOf returns the stream broker of a backend opened for
// [brokers.Redis], or nil for another backend.
func BrokerOf(b brokers.Backend) *Broker {
	if r, ok := b.(*backend); ok {
		return r.broker
	}
	return nil
}

func (b *backend) Topics(topic string) []string { return b.broker.Streams(topic) }

// TrimTopic trims every stream of topic (see [Broker.TrimTopic]).
func (b *backend) TrimTopic(ctx context.Context, topic string) (int64, error) {
	return b.broker.TrimTopic(ctx, topic)
}

// Subscriber has a client of its own: each stream it reads holds one of
// its connections in a blocking read.
func (b *backend) Subscriber(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
	opts = opts.WithDefaults()
	client, err := connectTo(context.Background(), b.cfg.Redis)
	if err != nil {
		return nil, err
	}
	sub, err := NewSubscriber(SubscriberConfig{
		Client:          client,
		ConsumerGroup:   group,
		Consumer:        consumer,
		BatchSize:       opts.InFlight,
		ClaimIdle:       opts.ClaimIdle,
		NackResendSleep: 100 * time.Millisecond,
		Logger:          watermill.NewSlogLogger(b.cfg.Logger),
	})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &ownedClientSubscriber{Subscriber: sub, client: client}, nil
}

type ownedClientSubscriber struct {
	*Subscriber
	client goredis.UniversalClient
	once   sync.Once
	err    error
}

// Close closes the subscriber, then its client; it is safe to call more
// than once (the universal Pub/Sub suite does).
func (s *ownedClientSubscriber) Close() error {
	s.once.Do(func() { s.err = errors.Join(s.Subscriber.Close(), s.client.Close()) })
	return s.err
}

func (b *backend) Close() error { return b.client.Close() }
