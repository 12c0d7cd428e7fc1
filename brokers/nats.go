package brokers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/forwarder/redisstreams"
)

// NATSConfig is the NATS JetStream block.
type NATSConfig struct {
	// URL defaults to nats://127.0.0.1:4222.
	URL string
	// StreamPrefix is prepended to every stream and subject name. Defaults
	// to "".
	StreamPrefix string
	// Replicas of each stream. Defaults to 1.
	Replicas int
	// PublishTimeout bounds one publish acknowledgement. Defaults to 5s.
	PublishTimeout time.Duration
}

// A topic is one JetStream stream (named after the topic, dots made
// underscores, as stream names forbid them) capturing the topic's subject
// and its partition subjects topic.0 ... topic.N-1. Each consumer group is a
// durable consumer per subject with a deliver (queue) group, so a group's
// instances share the messages. Messages carry Nats-Msg-Id = message id, so
// the server also drops a forwarder's re-publish within its duplicate
// window.
type natsBackend struct {
	cfg  Config
	conn *nats.Conn
	js   nats.JetStreamContext
	pub  *wmnats.Publisher
	jsc  wmnats.JetStreamConfig

	streams onceByKey
}

func openNATS(ctx context.Context, cfg Config) (Backend, error) {
	n := &cfg.NATS
	if n.URL == "" {
		n.URL = "nats://127.0.0.1:4222"
	}
	if n.Replicas == 0 {
		n.Replicas = 1
	}
	if n.PublishTimeout == 0 {
		n.PublishTimeout = 5 * time.Second
	}
	fail := func(err error) error {
		return fmt.Errorf("connect to NATS at %s: %w (is it running with JetStream, -js? try `make services-up`)", redact(n.URL), err)
	}
	conn, err := nats.Connect(n.URL, nats.Timeout(3*time.Second), nats.RetryOnFailedConnect(false), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fail(err)
	}
	js, err := conn.JetStream(nats.MaxWait(n.PublishTimeout))
	if err != nil {
		conn.Close()
		return nil, fail(err)
	}
	if _, err := js.AccountInfo(nats.Context(ctx)); err != nil {
		conn.Close()
		return nil, fail(err)
	}
	b := &natsBackend{cfg: cfg, conn: conn, js: js}
	b.jsc = wmnats.JetStreamConfig{
		TrackMsgId:        true,
		ConnectOptions:    []nats.JSOpt{nats.MaxWait(n.PublishTimeout)},
		DurableCalculator: func(group, topic string) string { return group + "_" + streamName(topic) },
	}
	b.pub, err = wmnats.NewPublisherWithNatsConn(conn, wmnats.PublisherPublishConfig{
		Marshaler: &wmnats.NATSMarshaler{}, SubjectCalculator: wmnats.DefaultSubjectCalculator, JetStream: b.jsc,
	}, watermill.NewSlogLogger(cfg.Logger))
	if err != nil {
		conn.Close()
		return nil, err
	}
	return b, nil
}

// streamName maps a subject to a valid stream name.
func streamName(subject string) string {
	return strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(subject)
}

func (b *natsBackend) Kind() Kind { return NATS }

func (b *natsBackend) Topics(topic string) []string {
	return redisstreams.TopicStreams(b.cfg.NATS.StreamPrefix, topic, b.cfg.Partitions)
}

// ensureStream creates topic's stream once per process; creating an
// existing stream with the same configuration is a no-op for the server.
func (b *natsBackend) ensureStream(topic string) error {
	return b.streams.do(topic, func() error {
		base := b.cfg.NATS.StreamPrefix + topic
		_, err := b.js.AddStream(&nats.StreamConfig{
			Name: streamName(base), Subjects: []string{base, base + ".*"},
			Storage: nats.FileStorage, Replicas: b.cfg.NATS.Replicas, Retention: nats.LimitsPolicy,
		})
		if err != nil && !errors.Is(err, nats.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create NATS stream for topic %q: %w", topic, err)
		}
		return nil
	})
}

func (b *natsBackend) Broker() forwarder.Broker { return natsBroker{b} }

type natsBroker struct{ b *natsBackend }

// Publish sends each message and waits for its acknowledgement, in order.
// Errors are the broker's (a NATS publish has no per-message refusal but
// size, which the forwarder's MaxPayloadBytes checks first), except a
// message over the server's max payload.
func (nb natsBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	b := nb.b
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if i > 0 && errors.Is(errs[i-1], forwarder.ErrBrokerUnavailable) {
			// The server is gone: the rest would each wait out the
			// publish timeout for the same answer.
			errs[i] = errs[i-1]
			continue
		}
		if err := b.ensureStream(m.Topic); err != nil {
			errs[i] = fmt.Errorf("%w: %w", forwarder.ErrBrokerUnavailable, err)
			continue
		}
		subject := redisstreams.StreamName(b.cfg.NATS.StreamPrefix, m.Topic, b.cfg.Partitions, m.AggregateID)
		m.Message.SetContext(ctx)
		if err := b.pub.Publish(subject, m.Message); err != nil {
			if errors.Is(err, nats.ErrMaxPayload) {
				errs[i] = err
			} else {
				errs[i] = fmt.Errorf("%w: publish to NATS: %w", forwarder.ErrBrokerUnavailable, err)
			}
		}
	}
	return errs
}

// Subscriber is a [NATSSubscriber]: a pull consumer delivering a whole
// fetch at once.
func (b *natsBackend) Subscriber(group, consumer string, opts SubscriberOptions) (message.Subscriber, error) {
	opts.setDefaults()
	sub, err := NewNATSSubscriber(NATSSubscriberConfig{
		JetStream: b.js,
		Group:     group,
		Stream:    func(subject string) string { return streamName(b.streamTopic(subject)) },
		BatchSize: opts.InFlight,
		AckWait:   opts.ClaimIdle,
		Logger:    watermill.NewSlogLogger(b.cfg.Logger),
	})
	if err != nil {
		return nil, fmt.Errorf("NATS subscriber for %q: %w", group, err)
	}
	return &provisioningSubscriber{Subscriber: sub, b: b}, nil
}

// provisioningSubscriber creates a topic's stream before subscribing, so a
// consumer that starts before any event was published does not fail.
type provisioningSubscriber struct {
	message.Subscriber
	b *natsBackend
}

func (s *provisioningSubscriber) Subscribe(ctx context.Context, subject string) (<-chan *message.Message, error) {
	if err := s.b.ensureStream(s.b.topicOf(subject)); err != nil {
		return nil, err
	}
	return s.Subscriber.Subscribe(ctx, subject)
}

// topicOf is the Outflow topic of a subject: the subject without its
// prefix and partition suffix.
func (b *natsBackend) topicOf(subject string) string {
	topic := strings.TrimPrefix(subject, b.cfg.NATS.StreamPrefix)
	if i := strings.LastIndexByte(topic, '.'); i >= 0 && b.cfg.Partitions > 1 {
		topic = topic[:i]
	}
	return topic
}

// streamTopic is the prefixed topic whose stream captures subject.
func (b *natsBackend) streamTopic(subject string) string {
	return b.cfg.NATS.StreamPrefix + b.topicOf(subject)
}

func (b *natsBackend) Close() error {
	b.conn.Close()
	return nil
}
