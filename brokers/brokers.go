package brokers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/configcheck"
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

// Kinds lists the built-in backends, the default first. Each is linked
// into a program only when its package (brokers/<kind>) is imported.
var Kinds = []Kind{Redis, NATS, AMQP, Kafka, SQL}

// ErrUnknownKind is returned for a Kind that is neither in [Kinds] nor
// registered.
var ErrUnknownKind = errors.New("unknown broker")

// Config is the broker configuration: which backend, and its block. Only
// the chosen block is read.
type Config struct {
	// Kind defaults to Redis.
	Kind Kind
	// StreamPartitions spreads each topic over this many streams or
	// subjects by a hash of the aggregate id, so consumers can scale out
	// while one aggregate stays on one ordered path. Must be the same for
	// the forwarder and the workers. Defaults to 1. (Not the forwarder's
	// lease partitions, forwarder.Config.Partitions.)
	StreamPartitions int
	Redis            RedisConfig
	NATS             NATSConfig
	AMQP             AMQPConfig
	Kafka            KafkaConfig
	SQL              SQLConfig
	// CloudEvents says how every backend but sql writes the CloudEvents
	// attributes of each message it publishes, in its binding (see
	// [WithCloudEvents]). The zero value writes them with the default
	// source; CloudEvents.Disabled turns them off.
	CloudEvents cloudevents.Config
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ParseKind validates a broker name, as given by --broker or
// OUTFLOW_BROKER: one of [Kinds], linked or not, or a kind registered with
// [Register].
func ParseKind(s string) (Kind, error) {
	k := Kind(strings.ToLower(strings.TrimSpace(s)))
	if slices.Contains(Kinds, k) {
		return k, nil
	}
	openersMu.RLock()
	_, ok := openers[k]
	names := make([]string, 0, len(Kinds)+len(openers))
	for _, k := range Kinds {
		names = append(names, string(k))
	}
	for k := range openers {
		if !slices.Contains(Kinds, k) {
			names = append(names, string(k))
		}
	}
	openersMu.RUnlock()
	if ok {
		return k, nil
	}
	slices.Sort(names[len(Kinds):])
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
	// AckWait). Defaults to DefaultClaimIdle.
	ClaimIdle time.Duration
}

// DefaultClaimIdle is the ClaimIdle of a subscriber, worker or handler
// that sets none: above any handler's usual time, so that only a dead
// consumer's messages are claimed.
const DefaultClaimIdle = 30 * time.Second

// WithDefaults returns o with its zero fields set to their defaults: what a
// backend's Subscriber applies first.
func (o SubscriberOptions) WithDefaults() SubscriberOptions {
	if o.InFlight <= 0 {
		o.InFlight = 100
	}
	if o.ClaimIdle <= 0 {
		o.ClaimIdle = DefaultClaimIdle
	}
	return o
}

// Opener opens one backend from a Config whose defaults are set: Kind,
// StreamPartitions (1 to 1024) and Logger. It reads its own block of the Config.
type Opener func(ctx context.Context, cfg Config) (Backend, error)

var (
	openersMu sync.RWMutex
	openers   = map[Kind]Opener{}
)

// Register makes a backend available to [Open] under kind. Each backend
// package calls it from its init function, as database/sql drivers do, so a
// program links only the backends it imports (brokers/all imports them
// all). A backend of one's own registers under a kind of its own, which
// [ParseKind] then accepts. Register panics when kind is empty, open is
// nil, or kind is registered twice: these are programming errors found at
// start-up.
func Register(kind Kind, open Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	if kind == "" || open == nil {
		panic("brokers: Register needs a kind and an opener")
	}
	if _, dup := openers[kind]; dup {
		panic(fmt.Sprintf("brokers: Register called twice for %q", kind))
	}
	openers[kind] = open
}

// ErrNotLinked is returned by [Open] for a backend this program knows but
// does not link: its package was not imported.
var ErrNotLinked = errors.New("broker backend not linked")

// Open connects to the configured backend. It fails, naming the backend
// and the URL tried, when the broker does not answer, and with
// [ErrNotLinked], naming the import to add, when the backend's package is
// not linked into the program.
func Open(ctx context.Context, cfg Config) (Backend, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	openersMu.RLock()
	open := openers[cfg.Kind]
	openersMu.RUnlock()
	if open != nil {
		return open(ctx, cfg)
	}
	if !slices.Contains(Kinds, cfg.Kind) {
		_, err := ParseKind(string(cfg.Kind))
		return nil, err
	}
	return nil, fmt.Errorf("%w: the %s backend is not linked into this program: add\n\timport _ %q\n(or %q for every backend)",
		ErrNotLinked, cfg.Kind, ImportPath(cfg.Kind), "github.com/outflow-dev/outflow/brokers/all")
}

func (c *Config) setDefaults() {
	c.Kind = cmp.Or(c.Kind, Redis)
	c.StreamPartitions = cmp.Or(c.StreamPartitions, 1)
	c.CloudEvents = c.CloudEvents.WithDefaults()
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	errs.Check(c.StreamPartitions >= 1 && c.StreamPartitions <= 1024, "StreamPartitions", "must be between 1 and 1024")
	if err := c.CloudEvents.Validate(); err != nil {
		errs = append(errs, err) // names its field
	}
	return errs.Err("broker config")
}

// ImportPath is the package of a built-in backend.
func ImportPath(k Kind) string { return "github.com/outflow-dev/outflow/brokers/" + string(k) }

// Trimmer is implemented by a [Backend] whose broker never deletes what was
// read (sql): Trim deletes what every consumer group has read, past the
// backend's retention. The forwarder process runs it periodically.
type Trimmer interface {
	Trim(ctx context.Context) (int64, error)
}

// TopicTrimmer is implemented by a [Backend] whose topics grow until trimmed
// by topic (Redis streams): TrimTopic removes, from each of topic's
// partitions, what every consumer group has acknowledged, and never what
// one has not.
type TopicTrimmer interface {
	TrimTopic(ctx context.Context, topic string) (int64, error)
}

// ReplayTopicPrefix starts the topic of every consumer's replays
// (consumer.ReplayTopic). A backend that deduplicates publishes by message
// id (NATS JetStream's Nats-Msg-Id) must not for these: a replay sends
// again, on purpose, what was sent before, perhaps a minute before.
const ReplayTopicPrefix = "outflow.replay."

// PartitionTopic maps a topic and an aggregate id to the broker topic
// (stream, subject, exchange) it goes to: prefix+topic with one partition,
// prefix+topic.N otherwise, N = FNV-1a of the aggregate id mod partitions.
// The redis, nats and amqp backends name their topics so.
func PartitionTopic(prefix, topic string, partitions int, aggregateID string) string {
	return partitionName(prefix, topic, partitions, PartitionIndex(aggregateID, partitions))
}

// PartitionIndex is the partition, of partitions, that key goes to: FNV-1a
// of the key modulo the count (0 with one partition).
func PartitionIndex(key string, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(partitions))
}

// PartitionTopics lists every broker topic of topic, as [PartitionTopic]
// names them: what a consumer subscribes to.
func PartitionTopics(prefix, topic string, partitions int) []string {
	out := make([]string, max(partitions, 1))
	for i := range out {
		out[i] = partitionName(prefix, topic, partitions, i)
	}
	return out
}

func partitionName(prefix, topic string, partitions, p int) string {
	if partitions <= 1 {
		return prefix + topic
	}
	return prefix + topic + "." + strconv.Itoa(p)
}

// AMQPQueueName is the queue of consumer group on exchange (one broker
// topic, see [Backend.Topics]) in the amqp backend: watermill-amqp's
// GenerateQueueNameTopicNameWithSuffix naming, so its subscribers find it.
func AMQPQueueName(exchange, group string) string { return exchange + "_" + group }

// Lag is what a consumer group has not handled yet on one topic.
type Lag struct {
	// Events is how many entries of the topic's partitions the group has
	// not handled yet: not delivered, or delivered and not acknowledged,
	// as far as the broker tells (each backend's package says what it
	// counts).
	Events int64
	// OldestAge is the age of the oldest of them; zero when Events is 0,
	// and when the broker cannot tell (amqp).
	OldestAge time.Duration
}

// LagReporter is implemented by a [Backend] that can tell a consumer
// group's lag: every built-in one (redis, nats, amqp, kafka, sql). The
// worker samples it into its lag metrics and `outflow stats` prints it. Lag
// only reads: it creates no stream, queue, topic, consumer, table or
// position, so asking about a group that never ran leaves the broker as
// it was. A group not created yet lags by what it will read first.
type LagReporter interface {
	Lag(ctx context.Context, group, topic string) (Lag, error)
}
