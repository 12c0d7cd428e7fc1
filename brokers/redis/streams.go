package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/redact"
)

// Config configures a [Broker].
type Config struct {
	// Client is the Redis connection. Required. The broker does not close it.
	Client goredis.UniversalClient
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
	cfg   Config
	acked ackedIDs // for the audit (audit.go)
}

var _ forwarder.Broker = (*Broker)(nil)

// New returns a Broker.
func New(cfg Config) (*Broker, error) {
	if cfg.Client == nil {
		return nil, errors.New("redis broker config: Client is required")
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 1
	}
	if cfg.Partitions < 1 || cfg.Partitions > 1024 {
		return nil, errors.New("redis broker config: Partitions must be between 1 and 1024")
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
func NewClient(ctx context.Context, url string) (goredis.UniversalClient, error) {
	var (
		client goredis.UniversalClient
		err    error
	)
	switch {
	case strings.Contains(url, "master_name="):
		var o *goredis.FailoverOptions
		if o, err = goredis.ParseFailoverURL(url); err == nil {
			client = goredis.NewFailoverClient(o)
		}
	case strings.Contains(url, "addr="):
		var o *goredis.ClusterOptions
		if o, err = goredis.ParseClusterURL(url); err == nil {
			client = goredis.NewClusterClient(o)
		}
	default:
		var o *goredis.Options
		if o, err = goredis.ParseURL(url); err == nil {
			client = goredis.NewClient(o)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("connect to Redis at %s: %w (is it running? try `make services-up`)", redact.URL(url), err)
	}
	return client, nil
}

// Stream returns the stream an aggregate's events of topic go to.
func (b *Broker) Stream(topic, aggregateID string) string {
	return brokers.PartitionTopic(b.cfg.StreamPrefix, topic, b.cfg.Partitions, aggregateID)
}

// Streams lists every stream of topic, for consumers to subscribe to.
func (b *Broker) Streams(topic string) []string {
	return brokers.PartitionTopics(b.cfg.StreamPrefix, topic, b.cfg.Partitions)
}

// Publish appends msgs in one pipeline, in order. It returns one error per
// message; errors that are Redis's state rather than the message's wrap
// forwarder.ErrBrokerUnavailable.
func (b *Broker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	errs := make([]error, len(msgs))
	pipe := b.cfg.Client.Pipeline()
	cmds := make([]*goredis.StringCmd, len(msgs))
	for i, m := range msgs {
		values, err := b.cfg.Marshaller.Marshal(m.Topic, m.Message)
		if err != nil {
			errs[i] = fmt.Errorf("encode entry: %w", err)
			continue
		}
		cmds[i] = pipe.XAdd(ctx, &goredis.XAddArgs{Stream: b.Stream(m.Topic, m.AggregateID), Values: values})
	}
	_, execErr := pipe.Exec(ctx)
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if err := c.Err(); err != nil {
			errs[i] = classify(err)
		} else {
			b.acked.note(c.Args()[1].(string), c.Val()) // XADD stream ...
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
	var rerr goredis.Error
	if errors.As(err, &rerr) && !errors.Is(err, goredis.ErrClosed) {
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
