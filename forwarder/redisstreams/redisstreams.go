// Package redisstreams is the forwarder's Redis Streams broker, the
// default.
//
// Entries use watermill-redisstream's wire format (fields
// _watermill_message_uuid = the message id, metadata = the envelope in
// msgpack, payload = the event JSON), so watermill-redisstream's subscriber,
// and any Watermill user, reads them.
//
// A batch is one pipeline: one round trip whatever its size. A topic maps to
// one stream, or to Partitions streams chosen by a hash of the aggregate id,
// so that consumers can scale out while each aggregate stays on one stream,
// in order; on Redis Cluster, distinct streams land on distinct slots.
//
// The client is a go-redis UniversalClient: a REDIS_URL naming a single
// server, a Sentinel set or a Cluster works alike (see [NewClient]).
//
// Streams are never trimmed with MAXLEN, which drops entries whether or not
// a consumer group has read them; [Broker.Trim] removes only entries every
// consumer group has acknowledged.
package redisstreams

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/forwarder"
)

// Config configures a [Broker].
type Config struct {
	// Client is the Redis connection. Required. The broker does not close it.
	Client redis.UniversalClient
	// Partitions splits every topic into this many streams by a hash of the
	// aggregate id. Defaults to 1: one stream per topic, named as the topic.
	Partitions int
	// StreamPrefix is prepended to every stream name. Defaults to "".
	StreamPrefix string
	// Marshaller encodes entries. Defaults to watermill-redisstream's.
	Marshaller redisstream.Marshaller
}

// Broker publishes to Redis Streams.
type Broker struct {
	cfg Config
}

var _ forwarder.Broker = (*Broker)(nil)

// New returns a Broker.
func New(cfg Config) (*Broker, error) {
	if cfg.Client == nil {
		return nil, errors.New("redisstreams config: Client is required")
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 1
	}
	if cfg.Partitions < 1 || cfg.Partitions > 1024 {
		return nil, errors.New("redisstreams config: Partitions must be between 1 and 1024")
	}
	if cfg.Marshaller == nil {
		cfg.Marshaller = redisstream.DefaultMarshallerUnmarshaller{}
	}
	return &Broker{cfg: cfg}, nil
}

// NewClient connects to the Redis that url names, in go-redis's URL forms:
//
//   - redis://[:password@]host:port/db, rediss://..., unix://...: one server;
//   - redis://host:port?addr=host2:port&addr=host3:port: a Cluster, seeded
//     with every address given;
//   - redis://sentinel:port?master_name=mymaster&addr=sentinel2:port: a
//     Sentinel-managed primary.
//
// It pings and reports a failure naming the URL (without its password):
// a configured but unreachable Redis fails at start, never hangs.
func NewClient(ctx context.Context, url string) (redis.UniversalClient, error) {
	var (
		client redis.UniversalClient
		err    error
	)
	switch {
	case strings.Contains(url, "master_name="):
		var o *redis.FailoverOptions
		if o, err = redis.ParseFailoverURL(url); err == nil {
			client = redis.NewFailoverClient(o)
		}
	case strings.Contains(url, "addr="):
		var o *redis.ClusterOptions
		if o, err = redis.ParseClusterURL(url); err == nil {
			client = redis.NewClusterClient(o)
		}
	default:
		var o *redis.Options
		if o, err = redis.ParseURL(url); err == nil {
			client = redis.NewClient(o)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("connect to Redis at %s: %w (is it running? try `make services-up`)", redact(url), err)
	}
	return client, nil
}

// Stream returns the stream an aggregate's events of topic go to.
func (b *Broker) Stream(topic, aggregateID string) string {
	return StreamName(b.cfg.StreamPrefix, topic, b.cfg.Partitions, aggregateID)
}

// Streams lists every stream of topic, for consumers to subscribe to.
func (b *Broker) Streams(topic string) []string {
	return TopicStreams(b.cfg.StreamPrefix, topic, b.cfg.Partitions)
}

// StreamName maps a topic and an aggregate id to a stream: the topic itself
// with one partition, topic.N (N = FNV-1a of the aggregate id mod
// partitions) otherwise.
func StreamName(prefix, topic string, partitions int, aggregateID string) string {
	p := 0
	if partitions > 1 {
		h := fnv.New32a()
		h.Write([]byte(aggregateID))
		p = int(h.Sum32() % uint32(partitions))
	}
	return partitionStream(prefix, topic, partitions, p)
}

func partitionStream(prefix, topic string, partitions, p int) string {
	if partitions <= 1 {
		return prefix + topic
	}
	return prefix + topic + "." + strconv.Itoa(p)
}

// Publish appends msgs in one pipeline, in order. It returns one error per
// message; errors that are Redis's state rather than the message's wrap
// forwarder.ErrBrokerUnavailable.
func (b *Broker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	errs := make([]error, len(msgs))
	pipe := b.cfg.Client.Pipeline()
	cmds := make([]*redis.StringCmd, len(msgs))
	for i, m := range msgs {
		values, err := b.cfg.Marshaller.Marshal(m.Topic, m.Message)
		if err != nil {
			errs[i] = fmt.Errorf("encode entry: %w", err)
			continue
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: b.Stream(m.Topic, m.AggregateID), Values: values})
	}
	_, execErr := pipe.Exec(ctx)
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if err := c.Err(); err != nil {
			errs[i] = classify(err)
		}
	}
	if execErr != nil && !anyErr(errs) {
		// The pipeline failed without a per-command error to show for it.
		for i := range errs {
			if cmds[i] != nil {
				errs[i] = classify(execErr)
			}
		}
	}
	return errs
}

func anyErr(errs []error) bool {
	for _, e := range errs {
		if e != nil {
			return true
		}
	}
	return false
}

// Redis error replies that describe the server's state, not the entry.
var unavailablePrefixes = []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "OOM", "NOREPLICAS", "MOVED", "ASK"}

// classify wraps err in ErrBrokerUnavailable unless Redis refused the
// entry itself.
func classify(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, redis.ErrClosed) {
		msg := rerr.Error()
		for _, p := range unavailablePrefixes {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: %v", forwarder.ErrBrokerUnavailable, err)
			}
		}
		return fmt.Errorf("redis refused the entry: %w", err)
	}
	// Anything else (a refused or dropped connection, a timeout, a closed
	// client) is the path to Redis failing, not the entry.
	return fmt.Errorf("%w: %v", forwarder.ErrBrokerUnavailable, err)
}

func redact(url string) string {
	if i := strings.Index(url, "@"); i >= 0 {
		if j := strings.Index(url, "://"); j >= 0 && j < i {
			return url[:j+3] + "***" + url[i:]
		}
	}
	return url
}

// TopicStreams lists every stream of topic for a given partition count: what
// consumers subscribe to.
func TopicStreams(prefix, topic string, partitions int) []string {
	out := make([]string, max(partitions, 1))
	for i := range out {
		out[i] = partitionStream(prefix, topic, partitions, i)
	}
	return out
}
