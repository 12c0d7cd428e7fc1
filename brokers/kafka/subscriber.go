package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/poll"
)

// errSubscriberClosed is Subscribe's error after Close.
var errSubscriberClosed = errors.New("kafka subscriber closed")

// kafkaSubscriber creates the topic before subscribing, so a consumer that
// starts before any event was published does not fail, and watches the
// topic while it runs.
//
// Why the watch: sarama's consumers keep their partitions' offsets in
// memory and fetch by topic name. A topic deleted and recreated under a
// running subscription is read from the old topic's offsets, so the
// records the new topic holds below them are skipped, and those offsets
// are then committed against the new topic. Kafka drops a topic's
// committed offsets when it is deleted, so a subscription that leaves the
// group and joins again reads the new topic from its start
// (Offsets.Initial). Each subscription reads its topic's id every
// TopicCheckInterval and does that when the id changed, or when the topic
// was found missing and is back.
type kafkaSubscriber struct {
	*kafka.Subscriber
	b *kafkaBackend

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup // the subscriptions' goroutines
}

// Subscribe returns the subscription's own channel: the watermill
// subscription behind it is replaced when the topic is recreated. The
// messages the replaced one delivered and were not acked yet have their
// context cancelled; acking or nacking them does nothing, and the group
// delivers them again.
func (s *kafkaSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := validKafkaTopic(topic); err != nil {
		return nil, err
	}
	if err := s.b.ensureTopic(topic); err != nil {
		return nil, err
	}
	var id topicIdentity
	err := withContext(ctx, func() (err error) {
		_, id, err = s.b.describeTopic(topic)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("kafka subscribe %s: %w", topic, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errSubscriberClosed
	}
	subCtx, cancel := context.WithCancel(ctx)
	in, err := s.Subscriber.Subscribe(subCtx, topic)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("kafka subscribe %s: %w", topic, err)
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		s.run(ctx, topic, id, in, cancel, out)
	}()
	return out, nil
}

// run forwards the subscription's messages to out until ctx ends, the
// subscriber is closed or the watermill subscription ends on its own, and
// replaces that subscription when the watch finds the topic recreated.
func (s *kafkaSubscriber) run(ctx context.Context, topic string, id topicIdentity, in <-chan *message.Message, cancel context.CancelFunc, out chan<- *message.Message) {
	defer func() { cancel() }() // the current one's
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	defer watching.Wait()
	defer stopWatch()
	recreated := make(chan struct{}, 1)
	watching.Add(1)
	go func() {
		defer watching.Done()
		s.watch(watchCtx, topic, id, recreated)
	}()
	log := s.b.cfg.Logger.With("topic", topic)
	for {
		select {
		case m, ok := <-in:
			if !ok {
				return
			}
			select {
			case out <- m:
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			}
		case <-recreated:
			log.Info("kafka topic recreated: the subscription joins its group again to read it from its start")
			cancel()
			// What the old subscription still holds was never acked:
			// its offsets are not committed, the group delivers it again.
			for range in {
			}
			// Not assigned before ok: a failed resubscribe returns a nil
			// cancel, which the deferred call would then call (a panic
			// seen when the suite closed a subscriber mid-resubscribe).
			nin, ncancel, ok := s.resubscribe(ctx, topic)
			if !ok {
				return
			}
			in, cancel = nin, ncancel
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
	}
}

// resubscribe starts a new watermill subscription to topic, retrying until
// one starts; false when ctx ended or the subscriber was closed first.
func (s *kafkaSubscriber) resubscribe(ctx context.Context, topic string) (<-chan *message.Message, context.CancelFunc, bool) {
	for attempt := 1; ; attempt++ {
		subCtx, cancel := context.WithCancel(ctx)
		in, err := s.Subscriber.Subscribe(subCtx, topic)
		if err == nil {
			return in, cancel, true
		}
		cancel()
		s.b.cfg.Logger.Warn("kafka subscribe again after the topic's recreation failed, retrying", "topic", topic, "err", err)
		select {
		case <-ctx.Done():
			return nil, nil, false
		case <-s.closing:
			return nil, nil, false
		case <-time.After(backoff.Reconnect(attempt)):
		}
	}
}

// watch reads topic's identity every TopicCheckInterval until ctx ends,
// and signals recreated (without blocking: one pending signal covers every
// change found meanwhile) whenever it finds another topic than the one
// subscribed to.
func (s *kafkaSubscriber) watch(ctx context.Context, topic string, subscribed topicIdentity, recreated chan<- struct{}) {
	w := topicWatch{subscribed: subscribed}
	poll.Every(ctx, s.b.cfg.Kafka.TopicCheckInterval, func(ctx context.Context) error {
		var cur topicIdentity
		err := withContext(ctx, func() (err error) {
			_, cur, err = s.b.describeTopic(topic)
			return err
		})
		if err != nil {
			return err
		}
		if w.recreated(cur) {
			select {
			case recreated <- struct{}{}:
			default:
			}
		}
		return nil
	}, poll.Warn(s.b.cfg.Logger, "kafka subscription: reading its topic's id failed", "topic", topic))
}

// topicWatch follows a subscription's topic from check to check.
type topicWatch struct {
	subscribed topicIdentity // what the current subscription reads
	vanished   bool          // a check found the topic missing since
}

// recreated says whether cur, the topic as a check found it, is another
// topic than the one subscribed to; if so, the subscription about to
// start reads cur.
func (w *topicWatch) recreated(cur topicIdentity) bool {
	if !cur.exists {
		w.vanished = true
		return false
	}
	again := w.vanished || !w.subscribed.exists ||
		(w.subscribed.id != "" && cur.id != "" && cur.id != w.subscribed.id)
	if again || w.subscribed.id == "" {
		// The id may show up later for a topic found without one
		// (a broker upgraded under the subscription).
		w.subscribed, w.vanished = cur, false
	}
	return again
}

// SubscribeInitialize creates the topic (watermill-kafka's needs topic
// details the backend keeps itself).
func (s *kafkaSubscriber) SubscribeInitialize(topic string) error {
	if err := validKafkaTopic(topic); err != nil {
		return err
	}
	return s.b.ensureTopic(topic)
}

// Close ends every subscription and waits for their goroutines.
func (s *kafkaSubscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	err := s.Subscriber.Close()
	s.wg.Wait()
	return err
}

// incarnationTracer is no tracer: watermill-kafka's one hook into its
// consumer group handler, used to stamp each committed offset with the
// topic id it was read from and the message id of the record consumed
// last, and to check those stamps when a session starts.
//
// Why the topic id: the watch alone is not enough. The old subscription
// commits its last acks (once a second, and when it leaves) after the
// deletion, and may read and commit records of the new topic before the
// watch sees it; Kafka keeps those offsets for the new topic, and the
// group would resume there. So every commit carries the id of the topic
// its session started on, and a session starting reads back its
// partitions' commits: one stamped with another id than the topic's is
// the old topic's, and the partition is read again from its start.
//
// Why the message id: a truncation (an unclean leader election, a log
// restored from an older copy) keeps the topic id and cuts the log below
// offsets the group committed. Once new records (the audit's repair among
// them) fill the log past the committed offset again, the offset is valid
// to Kafka and the group would skip every record written since the cut.
// The stamp names the record before the committed offset: a session
// starting fetches that record, and when it is gone (the offset is past
// the log's end) or holds another message, the log was cut below it, and
// the partition is read again from its start (consumers drop what they
// already had). Commits without a stamp (made before this) are trusted.
// A session that runs through the cut is not helped: sarama does not
// check its position by leader epoch (KIP-320), so it resumes at its
// offset in memory and skips what the new leader wrote below it before
// its next fetch, and its next commits name records of the new log
// (docs/broker-loss.md, Kafka).
type incarnationTracer struct {
	b     *kafkaBackend
	group string // the Kafka consumer group
}

func (t incarnationTracer) WrapConsumer(c sarama.Consumer) sarama.Consumer { return c }

func (t incarnationTracer) WrapPartitionConsumer(pc sarama.PartitionConsumer) sarama.PartitionConsumer {
	return pc
}

func (t incarnationTracer) WrapSyncProducer(_ *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	return p
}

func (t incarnationTracer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	return &stampingHandler{ConsumerGroupHandler: h, t: t}
}

// stampingHandler serves one consumer group client, whose sessions run one
// after the other: Setup sets id before the session's ConsumeClaims start.
type stampingHandler struct {
	sarama.ConsumerGroupHandler
	t  incarnationTracer
	id string // the topic id the current session reads, "" when none
}

func (h *stampingHandler) Setup(sess sarama.ConsumerGroupSession) error {
	h.id = ""
	b := h.t.b
	for topic, parts := range sess.Claims() {
		err := withContext(sess.Context(), func() error {
			_, id, err := b.describeTopic(topic)
			if err != nil || !id.exists {
				return err
			}
			h.id = id.id // a subscription reads one topic
			resp, err := b.admin.ListConsumerGroupOffsets(h.t.group, map[string][]int32{topic: parts})
			if err != nil {
				return fmt.Errorf("committed offsets of group %s: %w", h.t.group, err)
			}
			for _, p := range parts {
				blk := resp.GetBlock(topic, p)
				if blk == nil || !errors.Is(blk.Err, sarama.ErrNoError) || blk.Offset < 0 || blk.Metadata == "" {
					continue
				}
				why, err := b.staleCommit(topic, id.id, p, blk.Offset, parseStamp(blk.Metadata))
				if err != nil {
					return err
				}
				if why == "" {
					continue
				}
				start, err := b.client.GetOffset(topic, p, sarama.OffsetOldest)
				if err != nil {
					return fmt.Errorf("log start offset of partition %d: %w", p, err)
				}
				b.cfg.Logger.Info("kafka: "+why+": the partition is read from its start",
					"group", h.t.group, "topic", topic, "partition", p, "committed", blk.Offset, "start", start)
				sess.ResetOffset(topic, p, start, stamp{topicID: id.id}.String())
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("kafka session setup, topic %s: %w", topic, err)
		}
	}
	return h.ConsumerGroupHandler.Setup(sess)
}

// staleCommit says why the offset a group committed on topic's partition p
// with stamp s does not hold for the topic as it is (of id), "" when it
// does: a commit of a deleted topic of the same name, or of a log since
// cut below it. Checking a message id costs two ListOffsets and a one-batch
// Fetch.
func (b *kafkaBackend) staleCommit(topic, id string, p int32, offset int64, s stamp) (string, error) {
	if s.topicID != "" && id != "" && s.topicID != id {
		return "offset committed for a deleted topic of the same name", nil
	}
	if s.messageID == "" {
		return "", nil
	}
	high, err := b.client.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		return "", fmt.Errorf("high watermark of partition %d: %w", p, err)
	}
	if offset > high {
		return "offset committed past the end of the log: the log was truncated", nil
	}
	start, err := b.client.GetOffset(topic, p, sarama.OffsetOldest)
	if err != nil {
		return "", fmt.Errorf("log start offset of partition %d: %w", p, err)
	}
	if offset-1 < start {
		return "", nil // retention took the record: nothing to compare
	}
	leader, err := b.client.Leader(topic, p)
	if err != nil {
		return "", fmt.Errorf("leader of partition %d: %w", p, err)
	}
	got, err := b.fetchFrom(leader, topic, map[int32]int64{p: offset - 1})
	if err != nil {
		return "", err
	}
	f := got[p]
	switch rec, ok := f.records[offset-1]; {
	case errors.Is(f.err, sarama.ErrOffsetOutOfRange):
		return "the record before the committed offset is gone: the log was truncated", nil
	case !errors.Is(f.err, sarama.ErrNoError):
		return "", fmt.Errorf("fetch partition %d at %d: %w", p, offset-1, f.err)
	case ok && rec != "" && rec != s.messageID:
		return "the record before the committed offset holds another message: the log was truncated and written again", nil
	}
	return "", nil
}

func (h *stampingHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	return h.ConsumerGroupHandler.ConsumeClaim(stampingSession{sess, h.id}, claim)
}

// stampingSession marks each offset with the topic id of its session and,
// for a message, the message's id.
type stampingSession struct {
	sarama.ConsumerGroupSession
	id string
}

func (s stampingSession) MarkMessage(msg *sarama.ConsumerMessage, _ string) {
	s.ConsumerGroupSession.MarkOffset(msg.Topic, msg.Partition, msg.Offset+1, stamp{topicID: s.id, messageID: headerID(msg.Headers)}.String())
}

func (s stampingSession) MarkOffset(topic string, partition int32, offset int64, _ string) {
	s.ConsumerGroupSession.MarkOffset(topic, partition, offset, stamp{topicID: s.id}.String())
}
