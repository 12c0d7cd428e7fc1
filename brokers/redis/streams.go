package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/redact"
)

// Config configures a [Broker].
type Config struct {
	// Client is the Redis connection. Required. The broker does not close it.
	Client goredis.UniversalClient
	// StreamPartitions splits every topic into this many streams by a hash
	// of the aggregate id. Defaults to 1: one stream per topic, named as
	// the topic.
	StreamPartitions int
	// StreamPrefix is prepended to every stream name. Defaults to "".
	StreamPrefix string
	// Marshaller encodes entries. Defaults to watermill-redisstream's.
	Marshaller redisstream.Marshaller
	// WaitReplicas, when above 0, ends each batch with WAIT WaitReplicas
	// WaitTimeout on the connection that wrote it (on a Cluster, on each
	// primary that took some of it): entries of a batch fewer replicas
	// acknowledged are reported unpublished, so the forwarder retries them
	// and a failover to a replica cannot lose what it marked. Defaults to 0.
	WaitReplicas int
	// MaxFieldBytes is the largest field value the server takes: its
	// proto-max-bulk-len, which bounds each argument of XADD. The broker is
	// a [forwarder.PayloadLimiter] with it, so the outbox writer refuses an
	// event whose entry would not fit. Defaults to
	// [DefaultMaxFieldBytes]; [ProtoMaxBulkLen] reads the server's.
	MaxFieldBytes int
	// WaitTimeout bounds each WAIT. Defaults to [DefaultWaitTimeout]. Keep
	// it below the client's read timeout (3s unless the URL says
	// read_timeout=): a read that times out first also counts as
	// unpublished, but after the longer wait.
	WaitTimeout time.Duration
}

// DefaultWaitTimeout is the WaitTimeout of a [Config] with WaitReplicas.
const DefaultWaitTimeout = time.Second

// ErrTooFewReplicas is wrapped, with [forwarder.ErrBrokerUnavailable], in
// the error of each entry of a batch that fewer than WaitReplicas replicas
// acknowledged in time.
var ErrTooFewReplicas = errors.New("fewer Redis replicas than WaitReplicas acknowledged the batch")

// ErrClusterNotConfigured is returned by [NewClient] for a URL naming a
// single server that runs in cluster mode.
var ErrClusterNotConfigured = errors.New("redis server is a Cluster node, not configured as a Cluster")

// Broker publishes to Redis Streams.
type Broker struct {
	cfg Config
	// auditHook, when a test sets it, runs in a Check between its first
	// reading of the groups' floors and its look for the held entries.
	auditHook func()
}

var _ forwarder.Broker = (*Broker)(nil)

func (c *Config) setDefaults() {
	c.StreamPartitions = cmp.Or(c.StreamPartitions, 1)
	if c.WaitReplicas > 0 && c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.Marshaller == nil {
		c.Marshaller = redisstream.DefaultMarshallerUnmarshaller{}
	}
	c.MaxFieldBytes = cmp.Or(c.MaxFieldBytes, DefaultMaxFieldBytes)
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Client != nil, "Client", "is required")
	check(c.StreamPartitions >= 1 && c.StreamPartitions <= 1024, "StreamPartitions", "must be between 1 and 1024")
	check(c.WaitReplicas >= 0, "WaitReplicas", "must not be negative")
	check(c.WaitTimeout >= 0 && c.WaitTimeout <= time.Minute, "WaitTimeout", "must be between 0 and 1m")
	check(c.MaxFieldBytes >= 0, "MaxFieldBytes", "must not be negative")
	return errs.Err("redis broker config")
}

// New returns a Broker.
func New(cfg Config) (*Broker, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
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
// a configured but unreachable Redis fails at start, never hangs. A URL
// naming one server that turns out to be a Cluster node fails with
// [ErrClusterNotConfigured]: streams on other nodes would only get MOVED
// replies. Use [NewClusterClient] for a Cluster named by one seed node.
func NewClient(ctx context.Context, url string) (goredis.UniversalClient, error) {
	return connect(ctx, url, false)
}

// NewClusterClient connects to the Redis Cluster that url names, by one
// seed node (redis://host:port) or several (?addr=host2:port...). It
// refuses a Sentinel URL, a unix socket and a database other than 0 (a
// Cluster has only database 0).
func NewClusterClient(ctx context.Context, url string) (goredis.UniversalClient, error) {
	return connect(ctx, url, true)
}

func connect(ctx context.Context, rawURL string, cluster bool) (goredis.UniversalClient, error) {
	var (
		client goredis.UniversalClient
		err    error
	)
	switch {
	case strings.Contains(rawURL, "master_name="):
		if cluster {
			return nil, errors.New("REDIS_URL: a Sentinel URL (master_name=) cannot name a Cluster")
		}
		var o *goredis.FailoverOptions
		if o, err = goredis.ParseFailoverURL(rawURL); err == nil {
			client = goredis.NewFailoverClient(o)
		}
	case cluster || strings.Contains(rawURL, "addr="):
		if err = clusterURLDatabase(rawURL); err != nil {
			break
		}
		var o *goredis.ClusterOptions
		if o, err = goredis.ParseClusterURL(rawURL); err == nil {
			client = goredis.NewClusterClient(o)
		}
	default:
		var o *goredis.Options
		if o, err = goredis.ParseURL(rawURL); err == nil {
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
		return nil, fmt.Errorf("connect to Redis at %s: %w (is it running? try `make services-up`)", redact.URL(rawURL), err)
	}
	if c, ok := client.(*goredis.Client); ok {
		info, err := c.Info(pctx, "cluster").Result()
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("connect to Redis at %s: INFO cluster: %w", redact.URL(rawURL), err)
		}
		if strings.Contains(info, "cluster_enabled:1") {
			client.Close()
			return nil, fmt.Errorf("%w: %s: set the Cluster option (--redis-cluster, REDIS_CLUSTER=true) or name more nodes with ?addr=host:port",
				ErrClusterNotConfigured, redact.URL(rawURL))
		}
	}
	return client, nil
}

// clusterURLDatabase refuses a Cluster URL that names a database other
// than 0, which go-redis would silently ignore.
func clusterURLDatabase(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return errors.New("cannot parse the URL") // never echoed: it may hold a password
	}
	if u.Scheme == "unix" {
		return errors.New("a Redis Cluster is reached over TCP: want redis:// or rediss://, not unix://")
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		return fmt.Errorf("a Redis Cluster has database 0 only, the URL names database %q", db)
	}
	return nil
}

// Stream returns the stream an aggregate's events of topic go to.
func (b *Broker) Stream(topic, aggregateID string) string {
	return brokers.PartitionTopic(b.cfg.StreamPrefix, topic, b.cfg.StreamPartitions, aggregateID)
}

// Streams lists every stream of topic, for consumers to subscribe to.
func (b *Broker) Streams(topic string) []string {
	return brokers.PartitionTopics(b.cfg.StreamPrefix, topic, b.cfg.StreamPartitions)
}

// Publish appends msgs in one pipeline, in order. It returns one error per
// message; errors that are Redis's state rather than the message's wrap
// forwarder.ErrBrokerUnavailable. With WaitReplicas, the batch is split by
// the primary that holds each stream (one group without a Cluster), each
// group is one pipeline ending with WAIT on its own connection, and the
// entries of a group that too few replicas acknowledged wrap
// [ErrTooFewReplicas] as well: they were written, and will be written
// again by the retry (consumers deduplicate), but nothing says they would
// survive a failover.
func (b *Broker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	return b.publish(ctx, msgs, nil)
}

// PublishReceipts is Publish, returning each acknowledged entry's stream
// and id: [forwarder.Auditor].
func (b *Broker) PublishReceipts(ctx context.Context, msgs []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	receipts := make([]forwarder.Receipt, len(msgs))
	return receipts, b.publish(ctx, msgs, receipts)
}

// publish is Publish; when receipts is not nil, it sets receipts[i] to
// msgs[i]'s stream and the id Redis gave it.
func (b *Broker) publish(ctx context.Context, msgs []forwarder.Outgoing, receipts []forwarder.Receipt) []error {
	errs := make([]error, len(msgs))
	entries := make([]entry, 0, len(msgs))
	for i, m := range msgs {
		values, err := b.cfg.Marshaller.Marshal(m.Topic, m.Message)
		if err != nil {
			errs[i] = fmt.Errorf("encode entry: %w", err)
			continue
		}
		entries = append(entries, entry{i: i, stream: b.Stream(m.Topic, m.AggregateID), values: values})
	}
	if len(entries) == 0 {
		return errs
	}
	if b.cfg.WaitReplicas == 0 {
		// A Cluster client's pipeline splits by node and follows MOVED
		// replies by itself.
		b.pipeline(ctx, b.cfg.Client, entries, errs, receipts, false)
		return errs
	}
	groups, err := b.byPrimary(ctx, entries)
	if err != nil {
		for _, e := range entries {
			errs[e.i] = classify(err)
		}
		return errs
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { b.pipeline(ctx, g.client, g.entries, errs, receipts, true) }) // each sets errs and receipts of its own entries only
	}
	wg.Wait()
	if cc, ok := b.cfg.Client.(*goredis.ClusterClient); ok && anyErr(errs) {
		// A primary failed or a slot moved: learn the new layout before the
		// retry, which the node clients would not do by themselves.
		cc.ReloadState(ctx)
	}
	return errs
}

// entry is one message of a batch, encoded, with its index in the batch.
type entry struct {
	i      int
	stream string
	values map[string]any
}

type pipeliner interface {
	Pipeline() goredis.Pipeliner
}

// primaryGroup is the part of a batch whose streams one primary holds.
type primaryGroup struct {
	client  pipeliner
	entries []entry
}

// byPrimary splits entries by the primary holding their stream: WAIT
// counts the replicas of one connection's writes, so a batch's WAIT must
// go to every primary it wrote to, on the connection that wrote there.
// Without a Cluster, the one server (or Sentinel's primary) holds all.
func (b *Broker) byPrimary(ctx context.Context, entries []entry) ([]primaryGroup, error) {
	cc, ok := b.cfg.Client.(*goredis.ClusterClient)
	if !ok {
		return []primaryGroup{{client: b.cfg.Client, entries: entries}}, nil
	}
	var groups []primaryGroup
	of := map[*goredis.Client]int{} // primary -> index in groups
	for _, e := range entries {
		node, err := cc.MasterForKey(ctx, e.stream)
		if err != nil {
			return nil, fmt.Errorf("redis cluster primary of %s: %w", e.stream, err)
		}
		k, seen := of[node]
		if !seen {
			k = len(groups)
			of[node] = k
			groups = append(groups, primaryGroup{client: node})
		}
		groups[k].entries = append(groups[k].entries, e)
	}
	return groups, nil
}

// pipeline appends entries in one pipeline on c, then WAITs when wait is
// set, and sets errs (and receipts, when not nil) of those entries.
func (b *Broker) pipeline(ctx context.Context, c pipeliner, entries []entry, errs []error, receipts []forwarder.Receipt, wait bool) {
	pipe := c.Pipeline()
	cmds := make([]*goredis.StringCmd, len(entries))
	for k, e := range entries {
		cmds[k] = pipe.XAdd(ctx, &goredis.XAddArgs{Stream: e.stream, Values: e.values})
	}
	var waitCmd *goredis.Cmd
	if wait {
		// Never 0 ms, which WAIT takes as "block for ever".
		waitCmd = pipe.Do(ctx, "wait", b.cfg.WaitReplicas, max(b.cfg.WaitTimeout.Milliseconds(), 1))
	}
	_, execErr := pipe.Exec(ctx)
	failed := false
	for k, e := range entries {
		if err := cmds[k].Err(); err != nil {
			errs[e.i], failed = classify(err), true
		}
	}
	if waitCmd != nil {
		// Whatever WAIT answered short of n replicas, every entry that
		// Redis took is reported unpublished.
		n, err := waitCmd.Int64()
		switch {
		case err != nil:
			err = unavailable(fmt.Errorf("WAIT: %w", err))
		case n < int64(b.cfg.WaitReplicas):
			err = fmt.Errorf("%w: %w: %d of %d within %s", forwarder.ErrBrokerUnavailable, ErrTooFewReplicas,
				n, b.cfg.WaitReplicas, b.cfg.WaitTimeout)
		}
		if err != nil {
			for _, e := range entries {
				if errs[e.i] == nil {
					errs[e.i] = err
				}
			}
		}
	} else if execErr != nil && !failed {
		// The pipeline failed without a per-entry error to show for it.
		for _, e := range entries {
			errs[e.i] = classify(execErr)
		}
	}
	if receipts != nil {
		for k, e := range entries {
			if errs[e.i] == nil {
				receipts[e.i] = forwarder.Receipt{BrokerTopic: e.stream, Position: cmds[k].Val()}
			}
		}
	}
}

// unavailable wraps err in ErrBrokerUnavailable: a WAIT that failed says
// nothing against the entries, whatever Redis replied.
func unavailable(err error) error {
	if errors.Is(err, forwarder.ErrBrokerUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %v", forwarder.ErrBrokerUnavailable, err)
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
