package watermillbackend_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/watermillbackend"
	"github.com/outflow-dev/outflow/brokers/watermillpub"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// goChannelBackend is the backend over gc, which is both sides.
func goChannelBackend(t *testing.T, gc *gochannel.GoChannel) *watermillbackend.Backend {
	t.Helper()
	return newBackend(t, watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc}, Subscriber: gc})
}

// publish publishes n messages to topic through b's broker, numbered from
// from in their "n" metadata, and requires each to succeed.
func publish(t *testing.T, b brokers.Backend, topic string, from, n int) {
	t.Helper()
	msgs := make([]forwarder.Outgoing, n)
	for i := range msgs {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set("n", fmt.Sprint(from+i))
		msgs[i] = forwarder.Outgoing{Topic: topic, AggregateID: "a", Message: m}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, err := range b.Broker().Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("publish message %d: %v", from+i, err)
		}
	}
}

// reader is one consumer of a group reading a topic, acking what it
// gets unless told to hold it.
type reader struct {
	sub  message.Subscriber
	mu   sync.Mutex
	got  []string           // "n" of each delivery, in order
	msgs []*message.Message // each delivery, in order
	hold bool               // take messages without settling them
	done chan struct{}
}

func consume(t *testing.T, b brokers.Backend, group, topic string, hold bool) *reader {
	t.Helper()
	return consumeWith(t, b, group, topic, hold, brokers.SubscriberOptions{})
}

func consumeWith(t *testing.T, b brokers.Backend, group, topic string, hold bool, opts brokers.SubscriberOptions) *reader {
	t.Helper()
	sub, err := b.Subscriber(group, "c-"+watermill.NewShortUUID(), opts)
	if err != nil {
		t.Fatal(err)
	}
	c := &reader{sub: sub, hold: hold, done: make(chan struct{})}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		for m := range ch {
			c.mu.Lock()
			c.got = append(c.got, m.Metadata.Get("n"))
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
			if !hold {
				m.Ack()
			}
		}
	}()
	t.Cleanup(func() { c.close(t) })
	return c
}

// message is the i-th delivery.
func (c *reader) message(i int) *message.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.msgs[i]
}

func (c *reader) received() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

// close closes the consumer's subscriber and waits for its channel to
// close.
func (c *reader) close(t *testing.T) {
	t.Helper()
	if err := c.sub.Close(); err != nil {
		t.Errorf("close the subscriber: %v", err)
	}
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription's channel did not close after Close")
	}
}

func seq(from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(from + i)
	}
	return out
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// A GoChannel that is not persistent drops what is published to a topic
// nobody subscribes to yet while the forwarder marks the row published:
// refused, naming the setting, as Publisher or as Subscriber.
func TestNonPersistentGoChannelIsRefused(t *testing.T) {
	t.Parallel()
	gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer gc.Close()
	for _, cfg := range []watermillbackend.Config{
		{Publish: watermillpub.Config{Publisher: gc}, Subscriber: gc},
		{Publish: watermillpub.Config{Publisher: gc}, NewSubscriber: func(string, string, brokers.SubscriberOptions) (message.Subscriber, error) {
			return nil, errors.New("never called")
		}},
	} {
		_, err := watermillbackend.New(cfg)
		if !errors.Is(err, watermillbackend.ErrLosesMessages) {
			t.Fatalf("got %v, want ErrLosesMessages", err)
		}
		if !strings.Contains(err.Error(), "gochannel.Config.Persistent") {
			t.Fatalf("%q does not name the setting", err)
		}
	}
	other := persistent(t)
	_, err := watermillbackend.New(watermillbackend.Config{Publish: watermillpub.Config{Publisher: other}, Subscriber: gc})
	if !errors.Is(err, watermillbackend.ErrLosesMessages) || !strings.Contains(err.Error(), "Config.Subscriber") {
		t.Fatalf("a non-persistent Subscriber: got %v, want ErrLosesMessages naming Config.Subscriber", err)
	}
}

// Closing one group's subscriber ends that group's subscriptions only: the
// shared GoChannel goes on publishing to and delivering for the others,
// and closing the Backend leaves it open for its owner.
func TestClosingAGroupLeavesTheSharedPubSub(t *testing.T) {
	t.Parallel()
	gc := persistent(t)
	b := goChannelBackend(t, gc)
	g1 := consume(t, b, "g1", "orders", false)
	g2 := consume(t, b, "g2", "orders", false)
	publish(t, b, "orders", 1, 3)
	outflowtest.WaitFor(t, 10*time.Second, "both groups to receive 1-3", func() bool {
		return equal(g1.received(), seq(1, 3)) && equal(g2.received(), seq(1, 3))
	})

	g1.close(t)
	publish(t, b, "orders", 4, 3)
	outflowtest.WaitFor(t, 10*time.Second, "g2 to receive 4-6 after g1 closed", func() bool {
		return equal(g2.received(), seq(1, 6))
	})

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g2.done:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the Backend did not end its subscriptions")
	}
	if err := gc.Publish("orders", message.NewMessage(watermill.NewUUID(), nil)); err != nil {
		t.Fatalf("the GoChannel after the Backend closed: %v", err)
	}
	if _, err := b.Subscriber("g3", "c", brokers.SubscriberOptions{}); !errors.Is(err, watermillbackend.ErrClosed) {
		t.Fatalf("Subscriber after Close: got %v, want ErrClosed", err)
	}
}

// A factory returning the shared pubsub (what closing one group would
// close for all) is refused when the subscriber is asked for.
func TestSharedSubscriberFromTheFactoryIsRefused(t *testing.T) {
	t.Parallel()
	gc := persistent(t)
	// The Publisher itself, and the GoChannel behind a Publisher wrapping it.
	for _, pub := range []message.Publisher{gc, &cuttable{Publisher: gc}} {
		b := newBackend(t, watermillbackend.Config{Publish: watermillpub.Config{Publisher: pub},
			NewSubscriber: func(string, string, brokers.SubscriberOptions) (message.Subscriber, error) { return gc, nil }})
		if _, err := b.Subscriber("g1", "c", brokers.SubscriberOptions{}); !errors.Is(err, watermillbackend.ErrSharedSubscriber) {
			t.Fatalf("publisher %T: got %v, want ErrSharedSubscriber", pub, err)
		}
		if err := gc.Publish("orders", message.NewMessage(watermill.NewUUID(), nil)); err != nil {
			t.Fatalf("publisher %T: the refusal closed the GoChannel: %v", pub, err)
		}
	}
}

// The consumers of one group share its messages, each to one of them; each
// group gets them all.
func TestCompetingConsumersOfAGroup(t *testing.T) {
	t.Parallel()
	b := goChannelBackend(t, persistent(t))
	a1 := consume(t, b, "g", "orders", false)
	a2 := consume(t, b, "g", "orders", false)
	other := consume(t, b, "other", "orders", false)
	const n = 200
	publish(t, b, "orders", 1, n)
	outflowtest.WaitFor(t, 20*time.Second, "every message to reach each group", func() bool {
		return len(a1.received())+len(a2.received()) >= n && len(other.received()) == n
	})
	seen := map[string]int{}
	for _, v := range append(a1.received(), a2.received()...) {
		seen[v]++
	}
	for v, k := range seen {
		if k > 1 {
			t.Fatalf("message %s handled %d times by group g", v, k)
		}
	}
	if len(seen) != n || !equal(other.received(), seq(1, n)) {
		t.Fatalf("group g got %d distinct of %d; the other group %d", len(seen), n, len(other.received()))
	}
}

// A message a consumer was handed stays its own after it closes (the
// Watermill router closes its subscriber while its handlers still run):
// not handed to another consumer of the group, whose handler would run at
// the same time, and the first handler's ack counts.
func TestAHandledMessageStaysWithItsConsumerAfterItCloses(t *testing.T) {
	t.Parallel()
	b := goChannelBackend(t, persistent(t))
	holder := consume(t, b, "g", "orders", true)
	publish(t, b, "orders", 1, 1)
	outflowtest.WaitFor(t, 10*time.Second, "the holder to take message 1", func() bool { return len(holder.received()) == 1 })
	next := consume(t, b, "g", "orders", false)
	holder.close(t)
	publish(t, b, "orders", 2, 1)
	outflowtest.WaitFor(t, 10*time.Second, "the other consumer to get message 2", func() bool { return len(next.received()) >= 1 })
	// A nack follows the close at once when it comes (it did before the
	// fix), and nothing later marks its absence: a short bounded wait.
	select {
	case <-holder.message(0).Nacked():
		t.Fatal("message 1 was nacked when its consumer closed, while its handler ran")
	case <-time.After(200 * time.Millisecond):
	}
	if !holder.message(0).Ack() {
		t.Fatal("the handler's ack of message 1 after its consumer closed was refused")
	}
	publish(t, b, "orders", 3, 1)
	outflowtest.WaitFor(t, 10*time.Second, "the other consumer to get message 3", func() bool { return len(next.received()) >= 2 })
	if got := next.received(); !equal(got, seq(2, 2)) {
		t.Fatalf("the other consumer got %v, want 2,3 only", got)
	}
}

// A message nacked after its consumer closed goes to another consumer of
// the group.
func TestAMessageNackedAfterItsConsumerClosedGoesToAnother(t *testing.T) {
	t.Parallel()
	b := goChannelBackend(t, persistent(t))
	holder := consume(t, b, "g", "orders", true)
	publish(t, b, "orders", 1, 1)
	outflowtest.WaitFor(t, 10*time.Second, "the holder to take message 1", func() bool { return len(holder.received()) == 1 })
	next := consume(t, b, "g", "orders", false)
	holder.close(t)
	holder.message(0).Nack()
	outflowtest.WaitFor(t, 10*time.Second, "the other consumer to get message 1", func() bool {
		return equal(next.received(), seq(1, 1))
	})
}

// A message a consumer took from its group but had not handed out when it
// closed (nobody read its channel) goes to another consumer of the group.
func TestAMessageNotHandedOutGoesToAnother(t *testing.T) {
	t.Parallel()
	b := goChannelBackend(t, persistent(t))
	idle, err := b.Subscriber("g", "idle", brokers.SubscriberOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idle.Subscribe(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	publish(t, b, "orders", 1, 1)
	next := consume(t, b, "g", "orders", false)
	if err := idle.Close(); err != nil {
		t.Fatal(err)
	}
	outflowtest.WaitFor(t, 10*time.Second, "the other consumer to get message 1", func() bool {
		return equal(next.received(), seq(1, 1))
	})
}

// A consumer holds InFlight messages unsettled at most: the next goes to
// another consumer of the group, or to it once one is acked or nacked.
func TestInFlightBoundsAConsumersUnsettledMessages(t *testing.T) {
	t.Parallel()
	b := goChannelBackend(t, persistent(t))
	holder := consumeWith(t, b, "g", "orders", true, brokers.SubscriberOptions{InFlight: 1})
	publish(t, b, "orders", 1, 2)
	outflowtest.WaitFor(t, 10*time.Second, "the holder to take message 1", func() bool { return len(holder.received()) >= 1 })
	other := consume(t, b, "g", "orders", false)
	outflowtest.WaitFor(t, 10*time.Second, "the other consumer to get message 2, which the holder may not take", func() bool {
		return equal(other.received(), seq(2, 1))
	})
	other.close(t)
	if got := holder.received(); !equal(got, seq(1, 1)) {
		t.Fatalf("the holder (InFlight 1) got %v unsettled", got)
	}

	holder.message(0).Ack()
	publish(t, b, "orders", 3, 1)
	outflowtest.WaitFor(t, 10*time.Second, "the holder to take message 3 after its ack", func() bool {
		return equal(holder.received(), []string{"1", "3"})
	})
	holder.message(1).Nack()
	outflowtest.WaitFor(t, 10*time.Second, "the holder to get message 3 again after its nack", func() bool {
		return equal(holder.received(), []string{"1", "3", "3"})
	})
}

// A message handed to a consumer carries no sequence number: published
// again to another topic with its metadata (as Watermill's PoisonQueue
// does), it reaches that topic's groups instead of being held for numbers
// that never come. A nacked message still comes again: the GoChannel
// redelivers its own copy, number and all.
func TestAMessagePublishedAgainIsNotHeld(t *testing.T) {
	t.Parallel()
	gc := persistent(t)
	b := goChannelBackend(t, gc)
	src := consume(t, b, "g", "orders", true)
	dead := consume(t, b, "dead-letters", "orders.dead", false)
	publish(t, b, "orders", 1, 3)
	outflowtest.WaitFor(t, 10*time.Second, "the consumer to take 1-3", func() bool { return len(src.received()) == 3 })
	m := src.message(2)
	if v := m.Metadata.Get(watermillbackend.SequenceKey); v != "" {
		t.Fatalf("a consumer's message carries the sequence number %q", v)
	}
	if err := gc.Publish("orders.dead", m.Copy()); err != nil {
		t.Fatal(err)
	}
	m.Ack()
	outflowtest.WaitFor(t, 10*time.Second, "the copy to reach the other topic's group", func() bool {
		return equal(dead.received(), []string{m.Metadata.Get("n")})
	})

	src.message(0).Nack()
	outflowtest.WaitFor(t, 10*time.Second, "the nacked message to come again", func() bool { return len(src.received()) == 4 })
	if got := src.received()[3]; got != src.received()[0] {
		t.Fatalf("after a nack of %s, got %s", src.received()[0], got)
	}
}

// A group that subscribes after messages were published gets the topic's
// history in the order it was published, which a GoChannel alone does not
// keep (it replays each message in a goroutine of its own).
func TestHistoryArrivesInPublishOrder(t *testing.T) {
	t.Parallel()
	b := goChannelBackend(t, persistent(t))
	const n = 300
	publish(t, b, "orders", 1, n)
	late := consume(t, b, "late", "orders", false)
	outflowtest.WaitFor(t, 20*time.Second, "the late group to get the history", func() bool { return len(late.received()) >= n })
	if got := late.received(); !equal(got, seq(1, n)) {
		t.Fatalf("history out of order: %v", got)
	}
}

// New says which setting is missing or inconsistent, and sets the
// defaults.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	gc := persistent(t)
	factory := func(string, string, brokers.SubscriberOptions) (message.Subscriber, error) { return nil, nil }
	byAggregate := func(m forwarder.Outgoing) string { return m.Topic + "." + m.AggregateID }
	for _, tt := range []struct {
		name string
		cfg  watermillbackend.Config
		want string
	}{
		{"no publisher", watermillbackend.Config{Subscriber: gc}, "Publish.Publisher: is required"},
		{"no subscriber", watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc}}, "exactly one of Subscriber"},
		{"both subscribers", watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc}, Subscriber: gc, NewSubscriber: factory}, "exactly one of Subscriber"},
		{"topic without topics", watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc, Topic: byAggregate}, Subscriber: gc}, "Topics: is required"},
		{"two gochannels", watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc}, Subscriber: persistent(t)}, "Subscriber: must be Publish.Publisher when both are GoChannels"},
		{"watermillpub's own", watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc, MaxMessageBytes: -1}, Subscriber: gc}, "MaxMessageBytes: must not be negative"},
	} {
		if _, err := watermillbackend.New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	b := goChannelBackend(t, gc)
	if b.Kind() != watermillbackend.Kind || !equal(b.Topics("orders"), []string{"orders"}) {
		t.Fatalf("defaults: Kind %q, Topics %v", b.Kind(), b.Topics("orders"))
	}
}

// A GoChannel whose publishes wait for the subscribers' acks is taken, with
// a warning naming the setting.
func TestBlockingGoChannelIsWarnedOf(t *testing.T) {
	t.Parallel()
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer gc.Close()
	var log strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, nil))
	newBackend(t, watermillbackend.Config{Publish: watermillpub.Config{Publisher: gc}, Subscriber: gc, Logger: logger})
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "BlockPublishUntilSubscriberAck") {
		t.Fatalf("no warning naming BlockPublishUntilSubscriberAck: %q", log.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The factory gets the group, the consumer and the options with their
// defaults set, and its subscriber is handed over as it is: the caller's
// to close.
func TestFactoryGetsTheGroupAndDefaults(t *testing.T) {
	t.Parallel()
	var group, name string
	var opts brokers.SubscriberOptions
	own := persistent(t) // stands for a subscriber of the group's own: never the Publisher
	b := newBackend(t, watermillbackend.Config{Publish: watermillpub.Config{Publisher: &cuttable{Publisher: persistent(t)}},
		NewSubscriber: func(g, c string, o brokers.SubscriberOptions) (message.Subscriber, error) {
			group, name, opts = g, c, o
			return groupOwn{own}, nil
		}})
	sub, err := b.Subscriber("ledger", "instance-1", brokers.SubscriberOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if group != "ledger" || name != "instance-1" || opts != (brokers.SubscriberOptions{}).WithDefaults() {
		t.Fatalf("the factory got %q, %q, %+v", group, name, opts)
	}
	if sub != (groupOwn{own}) {
		t.Fatalf("got %v, want the factory's subscriber", sub)
	}
}

// A factory returning one subscriber to every call (built outside it) is
// refused on the second call, and the first group's subscriber is left
// open: it is in use.
func TestASubscriberTheFactoryReturnsTwiceIsRefused(t *testing.T) {
	t.Parallel()
	one := &closeCounter{}
	b := newBackend(t, watermillbackend.Config{Publish: watermillpub.Config{Publisher: persistent(t)},
		NewSubscriber: func(string, string, brokers.SubscriberOptions) (message.Subscriber, error) { return one, nil }})
	if _, err := b.Subscriber("g1", "c", brokers.SubscriberOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Subscriber("g2", "c", brokers.SubscriberOptions{}); !errors.Is(err, watermillbackend.ErrSharedSubscriber) {
		t.Fatalf("the same subscriber for a second group: got %v, want ErrSharedSubscriber", err)
	}
	if n := one.closed.Load(); n != 0 {
		t.Fatalf("the refusal closed the shared subscriber (%d times)", n)
	}
}

// closeCounter is a subscriber of a group's own that counts its Closes.
type closeCounter struct{ closed atomic.Int32 }

func (c *closeCounter) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return make(chan *message.Message), nil
}

func (c *closeCounter) Close() error { c.closed.Add(1); return nil }

// groupOwn is a subscriber of one group's own (not a GoChannel to the
// backend's eyes).
type groupOwn struct{ message.Subscriber }
