package watermillbackend

import (
	"context"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// hubKey names one group's subscription of one topic on Config.Subscriber.
type hubKey struct{ group, topic string }

// hub is a group's one subscription of a topic on Config.Subscriber: the
// group's consumers all read out, so each message goes to one of them. It
// lives while a consumer of the group reads the topic.
type hub struct {
	ready  chan struct{} // closed once out, done, err and cancel are set
	out    chan *message.Message
	done   <-chan struct{} // closed when the subscription ends
	err    error
	cancel context.CancelFunc
	users  int // consumers reading out (or waiting for ready); under Backend.mu
}

// join returns the hub of group and topic, subscribing Config.Subscriber
// when the group has none. The subscription does not end with ctx (it
// outlives the consumer that started it) but keeps its values.
func (b *Backend) join(ctx context.Context, group, topic string) (*hub, error) {
	k := hubKey{group, topic}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	h := b.hubs[k]
	first := h == nil
	if first {
		h = &hub{ready: make(chan struct{}), cancel: func() {}}
		b.hubs[k] = h
	}
	h.users++
	b.mu.Unlock()

	if first {
		// Subscribed without holding mu: a GoChannel's Subscribe waits for
		// a Publish in progress, which with BlockPublishUntilSubscriberAck
		// waits for each subscription to ack or end: the last consumer
		// of a group leaving (under mu) ends one.
		hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		in, err := b.cfg.Subscriber.Subscribe(hctx, topic)
		if err != nil {
			cancel()
			err = fmt.Errorf("watermill backend: subscribe group %q to %q: %w", group, topic, err)
		} else {
			h.out, h.done = make(chan *message.Message), hctx.Done()
			prefix := ""
			if b.seq != nil {
				prefix = b.seq.prefix(topic)
			}
			go h.run(hctx, in, prefix)
		}
		b.mu.Lock()
		h.err, h.cancel = err, cancel
		if b.closed { // Close ran while it subscribed
			cancel()
		}
		b.mu.Unlock()
		close(h.ready)
	} else {
		<-h.ready
	}
	if h.err != nil {
		b.leave(k, h)
		return nil, h.err
	}
	return h, nil
}

// leave ends the hub's subscription when its last consumer leaves: the
// subscriber then drops what it held for the group, and the group's next
// subscription starts over (a persistent GoChannel replays the topic).
func (b *Backend) leave(k hubKey, h *hub) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h.users--
	if h.users > 0 {
		return
	}
	h.cancel()
	if b.hubs[k] == h {
		delete(b.hubs, k)
	}
}

// run hands what the subscription delivers to the group's consumers, until
// it ends, and closes out. Numbered messages (prefix is not empty: see
// sequencer) go in the order of their numbers; only the numbers of prefix,
// this GoChannel's numbering of this topic, count.
func (h *hub) run(ctx context.Context, in <-chan *message.Message, prefix string) {
	defer close(h.out)
	next := uint64(1)
	held := map[uint64]*message.Message{}
	send := func(m *message.Message) bool {
		// A consumer's copy carries no number: published again with its
		// metadata (to another topic, by a PoisonQueue), it would pass
		// for a number of that topic. A nack redelivers the subscriber's
		// own copy, which keeps it.
		delete(m.Metadata, SequenceKey)
		select {
		case h.out <- m:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		if m, ok := held[next]; ok {
			delete(held, next)
			next++
			if !send(m) {
				return
			}
			continue
		}
		var m *message.Message
		select {
		case msg, ok := <-in:
			if !ok {
				return
			}
			m = msg
		case <-ctx.Done():
			return
		}
		n, ok := sequenceOf(m, prefix)
		if _, twice := held[n]; prefix == "" || !ok || n < next || twice {
			// Not numbered (or by another numbering, or for another
			// topic), delivered again after a nack, or a number
			// given twice (a publisher wrapped around the GoChannel
			// failed after it took the message): at once, as holding
			// it could hold it for good.
			if !send(m) {
				return
			}
			continue
		}
		held[n] = m
	}
}

// groupSubscriber is one consumer of a group over Config.Subscriber.
type groupSubscriber struct {
	b     *Backend
	group string
	// slots holds a token per message handed out and neither acked nor
	// nacked, across the consumer's topics: SubscriberOptions.InFlight
	// of them at most. A consumer at its bound takes nothing from its
	// group's subscription, which leaves the messages to the other
	// consumers, and with a bound of 1 a message is handed out only once
	// the one before it is settled, so the numbering orders the handling,
	// not only the hand-off.
	slots chan struct{}

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu     sync.Mutex
	closed bool
}

func newGroupSubscriber(b *Backend, group string, inFlight int) *groupSubscriber {
	return &groupSubscriber{b: b, group: group, slots: make(chan struct{}, inFlight), closing: make(chan struct{})}
}

// Subscribe reads topic as one consumer of the group: it gets the
// messages of the group's subscription that no other consumer of the group
// took, at most InFlight of them unsettled (acked or nacked) at a time. A
// message handed out stays with this consumer until it is settled, even
// after the subscription ended: its handler may still run (Watermill's
// router closes its subscriber before its handlers return), and another
// consumer handling it at the same time would repeat what the handler does
// outside its transaction. One the consumer took from the group's
// subscription but did not hand out before the subscription ended (ctx
// done, Close) is nacked, so that the group's subscription delivers it
// again, to another consumer. The channel closes when the subscription
// ends.
func (s *groupSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	h, err := s.b.join(ctx, s.group, topic)
	if err != nil {
		s.wg.Done()
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer s.b.leave(hubKey{s.group, topic}, h)
		for {
			// A slot before a message: taken while at the bound, the
			// message would wait here rather than go to another consumer.
			select {
			case s.slots <- struct{}{}:
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			}
			var m *message.Message
			select {
			case msg, ok := <-h.out:
				if !ok {
					<-s.slots
					return
				}
				m = msg
			case <-ctx.Done():
				<-s.slots
				return
			case <-s.closing:
				<-s.slots
				return
			}
			select {
			case out <- m:
			case <-ctx.Done():
				<-s.slots
				m.Nack()
				return
			case <-s.closing:
				<-s.slots
				m.Nack()
				return
			}
			// Watched until settled, or until the group's subscription
			// ends (the subscriber then forgets the message, and the
			// settling would change nothing): never nacked for this
			// consumer going away, as its handler may still run.
			go func() {
				defer func() { <-s.slots }()
				select {
				case <-m.Acked():
				case <-m.Nacked():
				case <-h.done:
				}
			}()
		}
	}()
	return out, nil
}

// Close ends this consumer's subscriptions and waits for them; the
// group's other consumers, the other groups and Config.Subscriber go on.
// The messages it handed out stay its own until they are settled. It is
// safe to call more than once.
func (s *groupSubscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}
