package nats

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/once"
	"github.com/outflow-dev/outflow/internal/redact"
)

func init() { brokers.Register(brokers.NATS, open) }

// A topic is one JetStream stream (named after the topic, dots made
// underscores, as stream names forbid them) capturing the topic's subject
// and its partition subjects topic.0 ... topic.N-1. Each consumer group is a
// durable consumer per subject with a deliver (queue) group, so a group's
// instances share the messages. Messages carry Nats-Msg-Id = message id, so
// the server also drops a forwarder's re-publish within its duplicate
// window.
type natsBackend struct {
	cfg  brokers.Config
	conn *nats.Conn
	js   nats.JetStreamContext // streams, consumers, subscriptions
	pjs  nats.JetStreamContext // the forwarder's async publishes

	streams once.ByKey

	mu      sync.Mutex
	missing map[string]time.Time // topic -> when a publish first found its stream missing
}

// open opens the nats backend of cfg (its NATS block), whose defaults
// [brokers.Open] has set.
func open(ctx context.Context, cfg brokers.Config) (brokers.Backend, error) {
	n := &cfg.NATS
	if n.URL == "" {
		n.URL = "nats://127.0.0.1:4222"
	}
	if n.Replicas == 0 {
		n.Replicas = 1
	}
	if n.Replicas < 1 || n.Replicas > 5 {
		// JetStream's own bounds: a stream has 1 to 5 replicas.
		return nil, errors.New("NATS config: Replicas must be between 1 and 5")
	}
	if n.PublishTimeout == 0 {
		n.PublishTimeout = 5 * time.Second
	}
	fail := func(err error) error {
		return fmt.Errorf("connect to NATS at %s: %w (is it running with JetStream, -js? try `make services-up`)", redact.URL(n.URL), err)
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
	pjs, err := conn.JetStream(nats.PublishAsyncMaxPending(natsMaxPending))
	if err != nil {
		conn.Close()
		return nil, fail(err)
	}
	b := &natsBackend{cfg: cfg, conn: conn, js: js, pjs: pjs}
	return b, nil
}

// streamName maps a subject to a valid stream name.
func streamName(subject string) string {
	return strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(subject)
}

func (b *natsBackend) Kind() brokers.Kind { return brokers.NATS }

func (b *natsBackend) Topics(topic string) []string {
	return brokers.PartitionTopics(b.cfg.NATS.StreamPrefix, topic, b.cfg.StreamPartitions)
}

// ensureStream creates topic's stream once per process.
func (b *natsBackend) ensureStream(topic string) error {
	return b.streams.Do(topic, func() error { return b.createStream(context.Background(), topic) })
}

// recreateDelay is how long a stream must have been missing before a
// publish creates it again. nats-server 2.9 removes a deleted stream's
// files after it answered the delete: a stream of the same name created at
// once has its message blocks removed under it (publishes fail with "error
// opening msg block file", a consumer created on it never delivers).
const recreateDelay = 2 * time.Second

// errStreamJustMissing is the answer of a publish within recreateDelay of
// finding its stream missing: the broker is unavailable, for that long.
var errStreamJustMissing = errors.New("stream missing: it is created again after " + recreateDelay.String())

// recreateStream creates topic's stream again once it has been missing for
// recreateDelay since a publish first found it so; a sighting older than a
// minute is taken as stale (the stream came back some other way).
func (b *natsBackend) recreateStream(ctx context.Context, topic string) error {
	b.mu.Lock()
	first, ok := b.missing[topic]
	if !ok || time.Since(first) > time.Minute {
		if b.missing == nil {
			b.missing = map[string]time.Time{}
		}
		first = time.Now()
		b.missing[topic] = first
	}
	b.mu.Unlock()
	if time.Since(first) < recreateDelay {
		return errStreamJustMissing
	}
	if err := b.createStream(ctx, topic); err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.missing, topic)
	b.mu.Unlock()
	b.cfg.Logger.Warn("NATS stream was missing: created again", "stream", streamName(b.cfg.NATS.StreamPrefix+topic))
	return nil
}

// createStream creates topic's stream with the configured settings;
// creating an existing stream with the same configuration is a no-op for
// the server, and one with another configuration (changed by an operator)
// is left as it is.
func (b *natsBackend) createStream(ctx context.Context, topic string) error {
	// Bounded as a publish: a request nobody answers (no meta leader)
	// would wait as long as ctx.
	ctx, cancel := context.WithTimeout(ctx, b.cfg.NATS.PublishTimeout)
	defer cancel()
	base := b.cfg.NATS.StreamPrefix + topic
	_, err := b.js.AddStream(&nats.StreamConfig{
		Name: streamName(base), Subjects: []string{base, base + ".*"},
		Storage: nats.FileStorage, Replicas: b.cfg.NATS.Replicas, Retention: nats.LimitsPolicy,
	}, nats.Context(ctx))
	if err != nil && !errors.Is(err, nats.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("create NATS stream for topic %q: %w", topic, err)
	}
	return nil
}

func (b *natsBackend) Broker() forwarder.Broker {
	return brokers.WithCloudEvents(natsBroker{b}, cloudevents.NATS, b.cfg.CloudEvents)
}

type natsBroker struct{ b *natsBackend }

var _ forwarder.PayloadLimiter = natsBroker{}

// MaxMessageBytes is the server's max_payload (1 MB by default), as the
// connection last learnt it; nats.go refuses a larger message.
func (nb natsBroker) MaxMessageBytes() int { return int(nb.b.conn.MaxPayload()) }

// MessageBytes is what nats.go counts against max_payload: the data and
// the encoded headers (the metadata, the message id, Nats-Msg-Id).
func (nb natsBroker) MessageBytes(m forwarder.Outgoing) int {
	nm, err := nb.b.natsMsg(m)
	if err != nil {
		return 0 // Publish reports it
	}
	var hdr bytes.Buffer
	if len(nm.Header) > 0 {
		hdr.WriteString("NATS/1.0\r\n")
		_ = http.Header(nm.Header).Write(&hdr)
		hdr.WriteString("\r\n")
	}
	return len(nm.Data) + hdr.Len()
}

// natsMsg is m as published: watermill-nats's format on m's subject, with
// the message id as Nats-Msg-Id (JetStream drops a second publish of an id
// within the stream's duplicate window: a forwarder's retry), except on a
// replay topic, where sending again is the point.
func (b *natsBackend) natsMsg(m forwarder.Outgoing) (*nats.Msg, error) {
	subject := b.subject(m.Topic, m.AggregateID)
	var marshaler wmnats.NATSMarshaler
	nm, err := marshaler.Marshal(subject, m.Message)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(m.Topic, brokers.ReplayTopicPrefix) {
		nm.Header.Set(nats.MsgIdHdr, m.Message.UUID)
	}
	return nm, nil
}

// subject is the subject of topic's aggregateID: the topic's own with one
// partition, one of its partition subjects otherwise.
func (b *natsBackend) subject(topic, aggregateID string) string {
	return brokers.PartitionTopic(b.cfg.NATS.StreamPrefix, topic, b.cfg.StreamPartitions, aggregateID)
}

// natsErrMessageTooLarge is JetStream's "message size exceeds maximum
// allowed" (JSStreamMessageExceedsMaximumErr): the stream's MaxMsgSize
// refused this one message.
const natsErrMessageTooLarge nats.ErrorCode = 10054

// natsMaxPending bounds the publishes awaiting their PubAck; a larger
// batch waits for room (nats.go stalls the publish, then fails it).
const natsMaxPending = 1024

// Publish sends the batch without waiting (PublishMsgAsync: one write per
// message, pipelined), in order, then waits for every PubAck, so a batch
// costs about one round trip instead of one per message. A message over the
// server's max payload, or over its stream's MaxMsgSize, fails alone;
// every other error is the broker's. When PublishTimeout passes first, the
// rest of the batch is unavailable: the rows stay
// pending and may be stored twice, which the duplicate window (Nats-Msg-Id
// = message id) and the consumers' deduplication absorb.
//
// A message no stream answered (the stream was deleted: no server listens
// on its subject) has its stream created again, with the configured
// settings, once it has been missing recreateDelay, and is sent once more;
// until then it is unavailable (the forwarder backs off and retries). The
// forwarder's audit sees the new stream and publishes again what the old
// one took with it.
func (nb natsBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	return nb.publishAll(ctx, msgs, nil)
}

// PublishReceipts is Publish, returning each acknowledged message's subject
// and stream sequence (the PubAck's; for a duplicate the server drops, the
// sequence of the copy it kept): [forwarder.Auditor].
func (nb natsBroker) PublishReceipts(ctx context.Context, msgs []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	seqs := make([]uint64, len(msgs))
	errs := nb.publishAll(ctx, msgs, seqs)
	receipts := make([]forwarder.Receipt, len(msgs))
	for i, m := range msgs {
		if errs[i] == nil {
			receipts[i] = forwarder.Receipt{BrokerTopic: nb.b.subject(m.Topic, m.AggregateID), Position: strconv.FormatUint(seqs[i], 10)}
		}
	}
	return receipts, errs
}

// publishAll is Publish; when seqs is not nil, it sets seqs[i] to the
// stream sequence of msgs[i]'s PubAck.
func (nb natsBroker) publishAll(ctx context.Context, msgs []forwarder.Outgoing, seqs []uint64) []error {
	errs := nb.publish(ctx, msgs, seqs)
	var (
		again   []forwarder.Outgoing
		at      []int
		created = map[string]error{}
	)
	for i, err := range errs {
		if !errors.Is(err, errNoStream) {
			continue
		}
		topic := msgs[i].Topic
		cerr, tried := created[topic]
		if !tried {
			cerr = nb.b.recreateStream(ctx, topic)
			created[topic] = cerr
		}
		if cerr != nil {
			errs[i] = fmt.Errorf("%w: %w: %w", forwarder.ErrBrokerUnavailable, errNoStream, cerr)
			continue
		}
		again, at = append(again, msgs[i]), append(at, i)
	}
	if len(again) == 0 {
		return errs
	}
	var againSeqs []uint64
	if seqs != nil {
		againSeqs = make([]uint64, len(again))
	}
	for j, err := range nb.publish(ctx, again, againSeqs) {
		errs[at[j]] = err
		if err == nil && seqs != nil {
			seqs[at[j]] = againSeqs[j]
		}
	}
	return errs
}

// errNoStream marks a publish no stream answered.
var errNoStream = errors.New("no stream for the subject")

// publish sends msgs once; when seqs is not nil, it sets seqs[i] to the
// stream sequence of msgs[i]'s PubAck.
func (nb natsBroker) publish(ctx context.Context, msgs []forwarder.Outgoing, seqs []uint64) []error {
	b := nb.b
	errs := make([]error, len(msgs))
	unavailable := func(err error) error {
		return fmt.Errorf("%w: publish to NATS: %w", forwarder.ErrBrokerUnavailable, err)
	}
	futures := make([]nats.PubAckFuture, len(msgs))
	for i, m := range msgs {
		if i > 0 && errors.Is(errs[i-1], forwarder.ErrBrokerUnavailable) {
			// The server is gone: the rest would get the same answer.
			errs[i] = errs[i-1]
			continue
		}
		if err := b.ensureStream(m.Topic); err != nil {
			errs[i] = fmt.Errorf("%w: %w", forwarder.ErrBrokerUnavailable, err)
			continue
		}
		nm, err := b.natsMsg(m)
		if err != nil {
			errs[i] = fmt.Errorf("marshal for NATS: %w", err)
			continue
		}
		if futures[i], err = b.pjs.PublishMsgAsync(nm); err != nil {
			if errors.Is(err, nats.ErrMaxPayload) {
				errs[i] = err
			} else {
				errs[i] = unavailable(err)
			}
		}
	}
	timeout := time.NewTimer(b.cfg.NATS.PublishTimeout)
	defer timeout.Stop()
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			if seqs != nil {
				seqs[i] = ack.Sequence
			}
		case err := <-f.Err():
			var apiErr *nats.APIError
			switch {
			case errors.As(err, &apiErr) && apiErr.ErrorCode == natsErrMessageTooLarge:
				errs[i] = fmt.Errorf("NATS refused the message: %w", err) // this message's fault
			case errors.Is(err, nats.ErrNoResponders):
				errs[i] = unavailable(fmt.Errorf("%w: %w", errNoStream, err))
			default:
				errs[i] = unavailable(err)
			}
		case <-ctx.Done():
			errs[i] = unavailable(ctx.Err())
		case <-timeout.C:
			// Acks that never came would hold their places in the
			// pending window: drop them (a concurrent batch's pending
			// publishes fail too, and are retried).
			b.pjs.CleanupPublisher()
			for j := i; j < len(futures); j++ {
				if futures[j] != nil && errs[j] == nil {
					errs[j] = unavailable(fmt.Errorf("no PubAck within %s", b.cfg.NATS.PublishTimeout))
				}
			}
			return errs
		}
	}
	return errs
}

// Subscriber is a [Subscriber]: a pull consumer delivering a whole
// fetch at once.
func (b *natsBackend) Subscriber(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
	opts = opts.WithDefaults()
	sub, err := NewSubscriber(SubscriberConfig{
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
	if i := strings.LastIndexByte(topic, '.'); i >= 0 && b.cfg.StreamPartitions > 1 {
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
