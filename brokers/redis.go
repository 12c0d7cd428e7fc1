package brokers

import (
	"errors"
	"sync"
	"time"

	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/forwarder/redisstreams"
)

// RedisConfig is the Redis Streams block.
type RedisConfig struct {
	// URL is a go-redis URL: one server, a Cluster or Sentinel (see
	// redisstreams.NewClient). Defaults to redis://127.0.0.1:6379/0.
	URL string
	// StreamPrefix is prepended to every stream name. Defaults to "".
	StreamPrefix string
}

type redisBackend struct {
	cfg    Config
	client redis.UniversalClient
	broker *redisstreams.Broker
}

func openRedis(ctx context.Context, cfg Config) (Backend, error) {
	if cfg.Redis.URL == "" {
		cfg.Redis.URL = "redis://127.0.0.1:6379/0"
	}
	client, err := redisstreams.NewClient(ctx, cfg.Redis.URL)
	if err != nil {
		return nil, err // names Redis and the redacted URL
	}
	broker, err := redisstreams.New(redisstreams.Config{Client: client, Partitions: cfg.Partitions, StreamPrefix: cfg.Redis.StreamPrefix})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &redisBackend{cfg: cfg, client: client, broker: broker}, nil
}

func (b *redisBackend) Kind() Kind               { return Redis }
func (b *redisBackend) Broker() forwarder.Broker { return b.broker }

// RedisBroker returns the Redis broker of a Redis backend (for stream
// trimming), or nil.
func RedisBroker(b Backend) *redisstreams.Broker {
	if r, ok := b.(*redisBackend); ok {
		return r.broker
	}
	return nil
}

func (b *redisBackend) Topics(topic string) []string {
	return redisstreams.TopicStreams(b.cfg.Redis.StreamPrefix, topic, b.cfg.Partitions)
}

// Subscriber has a client of its own: each stream it reads holds one of
// its connections in a blocking read.
func (b *redisBackend) Subscriber(group, consumer string, opts SubscriberOptions) (message.Subscriber, error) {
	opts.setDefaults()
	client, err := redisstreams.NewClient(context.Background(), b.cfg.Redis.URL)
	if err != nil {
		return nil, err
	}
	sub, err := redisstreams.NewSubscriber(redisstreams.SubscriberConfig{
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
	*redisstreams.Subscriber
	client redis.UniversalClient
	once   sync.Once
	err    error
}

// Close closes the subscriber, then its client; it is safe to call more
// than once (the universal Pub/Sub suite does).
func (s *ownedClientSubscriber) Close() error {
	s.once.Do(func() { s.err = errors.Join(s.Subscriber.Close(), s.client.Close()) })
	return s.err
}

func (b *redisBackend) Close() error { return b.client.Close() }
