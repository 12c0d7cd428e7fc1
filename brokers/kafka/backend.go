package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/once"
)

func init() { brokers.Register(brokers.Kafka, open) }

// An Outflow topic is one Kafka topic, <prefix><topic> with the characters
// Kafka forbids made '_'; its partitions spread the load. The key of every
// record is the aggregate id, so sarama's hash partitioner keeps one
// aggregate on one partition, in order. The wire format is
// watermill-kafka's (payload as value, metadata as headers, the message id
// in _watermill_message_uuid), so its subscriber reads what the forwarder
// wrote. Each consumer group (handler) is a Kafka consumer group starting
// at the oldest offset; an ack marks the offset, committed every second.
type kafkaBackend struct {
	cfg    brokers.Config
	client sarama.Client // the admin's
	admin  sarama.ClusterAdmin

	// The producer has a client of its own, so that a publish that timed
	// out can abort its sends by closing it (see Publish). nil after an
	// abort until the next publish opens a new one.
	pmu      sync.Mutex
	pclient  sarama.Client
	producer sarama.SyncProducer
	paborted *atomic.Bool // set when pclient is closed under the producer

	recordVersion int // sarama's record format, for ByteSize
	maxMessage    int // Producer.MaxMessageBytes

	topics once.ByKey
}

// open opens the kafka backend of cfg (its Kafka block), whose defaults
// [brokers.Open] has set.
func open(ctx context.Context, cfg brokers.Config) (brokers.Backend, error) {
	k := &cfg.Kafka
	if len(k.Brokers) == 0 {
		k.Brokers = []string{"127.0.0.1:9092"}
	}
	if k.TopicPartitions == 0 {
		k.TopicPartitions = 8
	}
	if k.ReplicationFactor == 0 {
		k.ReplicationFactor = -1
	}
	if k.Version == "" {
		k.Version = "2.8.0"
	}
	k.DialTimeout = cmp.Or(k.DialTimeout, 3*time.Second)
	k.PublishTimeout = cmp.Or(k.PublishTimeout, 10*time.Second)
	k.SessionTimeout = cmp.Or(k.SessionTimeout, 10*time.Second)
	k.TopicCheckInterval = cmp.Or(k.TopicCheckInterval, 5*time.Second)
	switch {
	case kafkaName(k.TopicPrefix) != k.TopicPrefix:
		return nil, fmt.Errorf("kafka config: TopicPrefix %q may hold only letters, digits, '.', '_' and '-'", k.TopicPrefix)
	case k.TopicPartitions < 1:
		return nil, errors.New("kafka config: TopicPartitions must be at least 1")
	case k.ReplicationFactor < -1:
		return nil, errors.New("kafka config: ReplicationFactor must be -1 (broker default) or at least 1")
	case k.DialTimeout < 0 || k.PublishTimeout < 0 || k.SessionTimeout < 0 || k.TopicCheckInterval < 0:
		return nil, errors.New("kafka config: DialTimeout, PublishTimeout, SessionTimeout and TopicCheckInterval must not be negative")
	}
	if _, err := sarama.ParseKafkaVersion(k.Version); err != nil {
		return nil, fmt.Errorf("kafka config: Version: %w", err)
	}
	b := &kafkaBackend{cfg: cfg, recordVersion: 1}
	pc := b.producerConfig()
	if pc.Version.IsAtLeast(sarama.V0_11_0_0) {
		b.recordVersion = 2 // as sarama's producer decides
	}
	b.maxMessage = pc.Producer.MaxMessageBytes

	fail := func(err error) error {
		return fmt.Errorf("connect to Kafka at %s: %w (is it running? check --kafka-brokers)", strings.Join(k.Brokers, ","), err)
	}
	// The probe fails fast: one retry, the whole metadata refresh bounded
	// by DialTimeout. The client kept afterwards retries as sarama does.
	probeCfg := b.saramaConfig()
	probeCfg.Metadata.Retry.Max = 1
	probeCfg.Metadata.Timeout = k.DialTimeout
	probe, err := newKafkaClient(ctx, k.Brokers, probeCfg)
	if err != nil {
		return nil, fail(err)
	}
	if err := probe.Close(); err != nil {
		return nil, fail(err)
	}
	if b.client, err = newKafkaClient(ctx, k.Brokers, b.producerConfig()); err != nil {
		return nil, fail(err)
	}
	if b.admin, err = sarama.NewClusterAdminFromClient(b.client); err != nil {
		b.client.Close()
		return nil, fail(err)
	}
	// The producer's limit is lowered to the topics' when theirs is
	// smaller: the forwarder and the outbox writer then refuse a record
	// the broker would, and sarama, which fills a partition's batch up to
	// it, never builds a batch over a topic's limit.
	if c := b.topicCeiling(cfg.Logger); c > 0 && c-recordBatchOverhead < b.maxMessage {
		b.maxMessage = c - recordBatchOverhead
	}
	if _, err := b.producerFor(ctx); err != nil {
		b.admin.Close()
		return nil, fail(err)
	}
	return b, nil
}

// producerFor returns the producer, opening one (and its client) if the
// last was aborted.
func (b *kafkaBackend) producerFor(ctx context.Context) (sarama.SyncProducer, error) {
	b.pmu.Lock()
	defer b.pmu.Unlock()
	if b.producer != nil {
		return b.producer, nil
	}
	cfg := b.producerConfig()
	// Once its client is closed, sarama fails every record still to send
	// one at a time, each after a retry backoff: 100 ms a record, so an
	// aborted batch of a few hundred took tens of seconds to report, with
	// the forwarder's transaction open. An aborted producer does not back
	// off.
	aborted := new(atomic.Bool)
	backoff := cfg.Producer.Retry.Backoff
	cfg.Producer.Retry.BackoffFunc = func(int, int) time.Duration {
		if aborted.Load() {
			return 0
		}
		return backoff
	}
	c, err := newKafkaClient(ctx, b.cfg.Kafka.Brokers, cfg)
	if err != nil {
		return nil, err
	}
	p, err := sarama.NewSyncProducerFromClient(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	b.pclient, b.producer, b.paborted = c, p, aborted
	return p, nil
}

// abortProducer closes p's client, which closes its connections: the sends
// in flight fail at once instead of being retried in the background after
// the caller gave up. The next publish opens a new producer.
func (b *kafkaBackend) abortProducer(p sarama.SyncProducer) {
	b.pmu.Lock()
	if b.producer != p {
		b.pmu.Unlock()
		return // already aborted by a concurrent publish
	}
	c := b.pclient
	b.paborted.Store(true)
	b.pclient, b.producer, b.paborted = nil, nil, nil
	b.pmu.Unlock()
	_ = c.Close()
}

// newKafkaClient is sarama.NewClient, which takes no context, given up on
// when ctx ends.
func newKafkaClient(ctx context.Context, brokers []string, cfg *sarama.Config) (sarama.Client, error) {
	type result struct {
		c   sarama.Client
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := sarama.NewClient(brokers, cfg)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.c != nil {
				_ = r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// saramaConfig is what producer and consumers share.
func (b *kafkaBackend) saramaConfig() *sarama.Config {
	k := b.cfg.Kafka
	c := sarama.NewConfig()
	c.Version, _ = sarama.ParseKafkaVersion(k.Version) // validated in openKafka
	c.ClientID = "outflow"
	c.Net.DialTimeout = k.DialTimeout
	return c
}

// producerConfig: acknowledged by all in-sync replicas, idempotent (the
// broker drops a retried batch it already has, and one in flight per
// connection keeps a partition's order across retries).
func (b *kafkaBackend) producerConfig() *sarama.Config {
	c := b.saramaConfig()
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Idempotent = true
	c.Net.MaxOpenRequests = 1
	c.Producer.Retry.Max = 5
	c.Producer.Timeout = b.cfg.Kafka.PublishTimeout
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = sarama.NewHashPartitioner
	c.Admin.Timeout = b.cfg.Kafka.PublishTimeout
	if b.maxMessage > 0 {
		c.Producer.MaxMessageBytes = b.maxMessage
	}
	return c
}

func (b *kafkaBackend) Kind() brokers.Kind { return brokers.Kafka }

// kafkaTopic is topic's Kafka name: the prefix, then topic with every
// character outside [a-zA-Z0-9._-] (Outflow also allows '$' and ':') made
// '_'. Two topics differing only there share one Kafka topic.
func (b *kafkaBackend) kafkaTopic(topic string) string {
	return b.cfg.Kafka.TopicPrefix + kafkaName(topic)
}

// kafkaName makes '_' of every character outside [a-zA-Z0-9._-], the only
// ones Kafka allows in topic names and client ids.
func kafkaName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, s)
}

// validKafkaTopic is the rest of Kafka's rule on names.
func validKafkaTopic(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 249 {
		return fmt.Errorf("kafka topic name %q is invalid (1 to 249 characters, not \".\" or \"..\")", name)
	}
	return nil
}

// Topics is the one Kafka topic: Kafka partitions do the spreading.
func (b *kafkaBackend) Topics(topic string) []string {
	return []string{b.kafkaTopic(topic)}
}

// ensureTopic creates a Kafka topic once per process; one that exists is
// left as it is.
func (b *kafkaBackend) ensureTopic(name string) error {
	return b.topics.Do(name, func() error { return b.createTopic(name) })
}

func (b *kafkaBackend) Broker() forwarder.Broker {
	return brokers.WithCloudEvents(kafkaBroker{b}, cloudevents.Kafka, b.cfg.CloudEvents)
}

type kafkaBroker struct{ b *kafkaBackend }

var _ forwarder.PayloadLimiter = kafkaBroker{}

// MaxMessageBytes is the producer's Producer.MaxMessageBytes, over which
// sarama refuses a record before sending it: sarama's default, 1,048,576,
// lowered when the backend opened to the smallest max.message.bytes of
// the cluster's default and of the existing topics under TopicPrefix,
// less a record batch's header (see topicCeiling). A topic whose
// max.message.bytes was lowered after that is the broker's to enforce:
// such a record is refused by the broker, as the row's own fault.
func (kb kafkaBroker) MaxMessageBytes() int {
	return kb.b.maxMessage
}

// MessageBytes is m's record size as sarama counts it against
// MaxMessageBytes: value, key, headers (the metadata and the message id)
// and the record overhead.
func (kb kafkaBroker) MessageBytes(m forwarder.Outgoing) int {
	pm, err := kafka.DefaultMarshaler{}.Marshal(kb.b.kafkaTopic(m.Topic), m.Message)
	if err != nil {
		return 0 // Publish reports it
	}
	if m.AggregateID != "" {
		pm.Key = sarama.StringEncoder(m.AggregateID)
	}
	return pm.ByteSize(kb.b.recordVersion)
}

// Publish sends the whole batch through one SendMessages: sarama groups it
// per partition leader and keeps each partition's order. A record too
// large, or one sarama refuses before sending, is the row's fault;
// anything else (no broker, no leader, timeouts) is the broker's.
func (kb kafkaBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	return kb.publish(ctx, msgs, nil)
}

// PublishReceipts is Publish, returning each acknowledged record's Kafka
// topic and "<partition>:<offset>", as the produce answer gave them:
// [forwarder.Auditor].
func (kb kafkaBroker) PublishReceipts(ctx context.Context, msgs []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	receipts := make([]forwarder.Receipt, len(msgs))
	return receipts, kb.publish(ctx, msgs, receipts)
}

// publish is Publish; when receipts is not nil, it sets the receipt of
// each message acknowledged.
func (kb kafkaBroker) publish(ctx context.Context, msgs []forwarder.Outgoing, receipts []forwarder.Receipt) []error {
	b := kb.b
	errs := make([]error, len(msgs))
	batch := make([]*sarama.ProducerMessage, 0, len(msgs))
	sent := make([]int, 0, len(msgs)) // batch[j] is msgs[sent[j]]
	for i, m := range msgs {
		name := b.kafkaTopic(m.Topic)
		if err := validKafkaTopic(name); err != nil {
			errs[i] = err
			continue
		}
		if err := b.ensureTopic(name); err != nil {
			errs[i] = fmt.Errorf("%w: %w", forwarder.ErrBrokerUnavailable, err)
			continue
		}
		pm, err := kafka.DefaultMarshaler{}.Marshal(name, m.Message)
		if err != nil {
			errs[i] = fmt.Errorf("marshal for Kafka: %w", err)
			continue
		}
		if m.AggregateID != "" {
			pm.Key = sarama.StringEncoder(m.AggregateID)
		}
		pm.Metadata = i
		batch = append(batch, pm)
		sent = append(sent, i)
	}
	if len(batch) == 0 {
		return errs
	}
	p, err := b.producerFor(ctx)
	if err != nil {
		for _, i := range sent {
			errs[i] = fmt.Errorf("%w: connect to Kafka: %w", forwarder.ErrBrokerUnavailable, err)
		}
		return errs
	}
	if receipts != nil {
		// sarama sets a record's partition and offset when the broker
		// acknowledges it, on the message given.
		defer func() {
			for j, pm := range batch {
				if i := sent[j]; errs[i] == nil && pm.Offset >= 0 {
					receipts[i] = forwarder.Receipt{BrokerTopic: pm.Topic, Position: position(pm.Partition, pm.Offset)}
				}
			}
		}()
	}
	done := make(chan error, 1)
	go func() { done <- p.SendMessages(batch) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Returning now would leave sarama retrying the batch in the
		// background while the forwarder sends the same rows again. Abort
		// the sends instead and wait until sarama has reported every
		// message: what it acknowledged before the abort is published,
		// the rest stays pending. The wait is short unless a request is
		// queued behind the hung one (other partitions, same broker):
		// sarama's broker then holds its lock, and the connection, until
		// the hung request's Net.ReadTimeout (30 s).
		b.abortProducer(p)
		err = <-done
		_ = p.Close()
		if err == nil {
			return errs
		}
		cause := context.Cause(ctx)
		var perrs sarama.ProducerErrors
		if errors.As(err, &perrs) {
			for _, pe := range perrs {
				errs[pe.Msg.Metadata.(int)] = fmt.Errorf("%w: publish to Kafka aborted: %w (%w)", forwarder.ErrBrokerUnavailable, cause, pe.Err)
			}
			return errs
		}
		for _, i := range sent {
			errs[i] = fmt.Errorf("%w: publish to Kafka aborted: %w (%w)", forwarder.ErrBrokerUnavailable, cause, err)
		}
		return errs
	}
	var perrs sarama.ProducerErrors
	switch {
	case err == nil:
	case errors.As(err, &perrs):
		for _, pe := range perrs {
			errs[pe.Msg.Metadata.(int)] = kafkaPublishError(pe.Err)
		}
	default:
		for _, i := range sent {
			errs[i] = kafkaPublishError(err)
		}
	}
	return errs
}

func kafkaPublishError(err error) error {
	var confErr sarama.ConfigurationError
	switch {
	case errors.Is(err, sarama.ErrMessageSizeTooLarge), errors.As(err, &confErr):
		// Over Producer.MaxMessageBytes (1 MB) is refused by sarama as a
		// ConfigurationError, over the broker's message.max.bytes by the
		// broker.
		return fmt.Errorf("publish to Kafka (message too large?): %w", err)
	case errors.Is(err, sarama.ErrInvalidRecord), errors.Is(err, sarama.ErrInvalidTopic):
		return fmt.Errorf("publish to Kafka: %w", err)
	}
	return fmt.Errorf("%w: publish to Kafka: %w", forwarder.ErrBrokerUnavailable, err)
}

// Subscriber is a watermill-kafka subscriber in consumer group
// <prefix><group>. Kafka gives each partition to one member and delivers
// its messages one at a time, the next only after the ack; partitions run
// concurrently, so the middleware shares transactions across them (at most
// TopicPartitions messages in flight: InFlight is not used). ClaimIdle is
// not used either: a live member keeps its partitions, a dead one loses
// them after SessionTimeout. A nack resends the message after 1s, holding
// its partition.
func (b *kafkaBackend) Subscriber(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
	c := b.saramaConfig()
	c.ClientID = "outflow-" + kafkaName(consumer)
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest // a new group reads the backlog
	c.Consumer.Offsets.AutoCommit.Interval = time.Second
	c.Consumer.Group.Session.Timeout = b.cfg.Kafka.SessionTimeout
	c.Consumer.Group.Heartbeat.Interval = b.cfg.Kafka.SessionTimeout / 3
	c.Consumer.Group.Rebalance.Timeout = b.cfg.Kafka.SessionTimeout
	c.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               b.cfg.Kafka.Brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: c,
		ConsumerGroup:         b.cfg.Kafka.TopicPrefix + group,
		NackResendSleep:       time.Second,
		ReconnectRetrySleep:   time.Second,
		Tracer:                incarnationTracer{b: b, group: b.cfg.Kafka.TopicPrefix + group},
	}, watermill.NewSlogLogger(b.cfg.Logger))
	if err != nil {
		return nil, fmt.Errorf("kafka subscriber for %q: %w", group, err)
	}
	return &kafkaSubscriber{Subscriber: sub, b: b, closing: make(chan struct{})}, nil
}

// Close flushes and closes the producer, then the clients.
func (b *kafkaBackend) Close() error {
	b.pmu.Lock()
	p, c := b.producer, b.pclient
	b.producer, b.pclient = nil, nil
	b.pmu.Unlock()
	var errs []error
	if p != nil {
		errs = append(errs, p.Close(), c.Close())
	}
	return errors.Join(append(errs, b.admin.Close())...)
}
