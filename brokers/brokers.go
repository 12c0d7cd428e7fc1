package brokers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/forwarder"
)

// Kind names a backend.
type Kind string

// The backends.
const (
	Redis Kind = "redis"
	NATS  Kind = "nats"
	AMQP  Kind = "amqp"
	Kafka Kind = "kafka"
	SQL   Kind = "sql"
)

// Kinds lists the backends this build knows, the default first.
var Kinds = []Kind{Redis, NATS, AMQP, Kafka, SQL}

// ErrUnknownKind is returned for a Kind that is not in [Kinds].
var ErrUnknownKind = errors.New("unknown broker")

// Config is the broker configuration: which backend, and its block. Only
// the chosen block is read.
type Config struct {
	// Kind defaults to Redis.
	Kind Kind
	// Partitions spreads each topic over this many streams or subjects by a
	// hash of the aggregate id, so consumers can scale out while one
	// aggregate stays on one ordered path. Must be the same for the
	// forwarder and the workers. Defaults to 1.
	Partitions int
	Redis      RedisConfig
	NATS       NATSConfig
	AMQP       AMQPConfig
	Kafka      KafkaConfig
	SQL        SQLConfig
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ParseKind validates a broker name, as given by --broker or
// OUTFLOW_BROKER.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == strings.ToLower(strings.TrimSpace(s)) {
			return k, nil
		}
	}
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return "", fmt.Errorf("%w %q (known: %s)", ErrUnknownKind, s, strings.Join(names, ", "))
}

// Backend is an opened broker.
type Backend interface {
	// Kind is the backend's name.
	Kind() Kind
	// Broker is what the forwarder publishes through.
	Broker() forwarder.Broker
	// Subscriber returns a new subscriber for one consumer group; consumer
	// names this process within it. Close it when done.
	Subscriber(group, consumer string, opts SubscriberOptions) (message.Subscriber, error)
	// Topics lists the broker topics (streams, subjects) a consumer of topic
	// reads: one per partition.
	Topics(topic string) []string
	// Close releases the connections. Subscribers are closed by their
	// owners first.
	Close() error
}

// SubscriberOptions are the consumer-side settings every backend honours
// as best it can.
type SubscriberOptions struct {
	// InFlight is how many messages may be delivered and not yet acked, so
	// that the middleware can share transactions among them. Defaults to
	// 100.
	InFlight int
	// ClaimIdle is how long a delivered message may stay unacked before the
	// broker gives it to another consumer of the group (Redis claim, NATS
	// AckWait). Defaults to 30s.
	ClaimIdle time.Duration
}

func (o *SubscriberOptions) setDefaults() {
	if o.InFlight <= 0 {
		o.InFlight = 100
	}
	if o.ClaimIdle <= 0 {
		o.ClaimIdle = 30 * time.Second
	}
}

// Open connects to the configured backend. It fails, naming the backend
// and the URL tried, when the broker does not answer.
func Open(ctx context.Context, cfg Config) (Backend, error) {
	if cfg.Kind == "" {
		cfg.Kind = Redis
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 1
	}
	if cfg.Partitions < 1 || cfg.Partitions > 1024 {
		return nil, errors.New("broker config: Partitions must be between 1 and 1024")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch cfg.Kind {
	case Redis:
		return openRedis(ctx, cfg)
	case NATS:
		return openNATS(ctx, cfg)
	case AMQP:
		return openAMQP(ctx, cfg)
	case Kafka:
		return openKafka(ctx, cfg)
	case SQL:
		return openSQL(ctx, cfg)
	}
	_, err := ParseKind(string(cfg.Kind))
	return nil, err
}

// redact hides a URL's password.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
