package watermillbackend

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/watermillpub"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/configcheck"
)

// Kind is the default [brokers.Kind] of the backend.
const Kind brokers.Kind = "watermill"

var (
	// ErrLosesMessages is returned for a setup that drops what the
	// forwarder publishes while the outbox records it as published: a
	// GoChannel without Persistent.
	ErrLosesMessages = errors.New("watermill backend: the setup drops messages")
	// ErrSharedSubscriber is returned when Config.NewSubscriber returns a
	// subscriber that other groups (or the forwarder) use too: the
	// Publisher, a GoChannel, or one it returned before. Closing one
	// group's subscriber would close it for all.
	ErrSharedSubscriber = errors.New("watermill backend: NewSubscriber returned a shared subscriber")
	// ErrClosed is returned by a closed Backend or subscriber.
	ErrClosed = errors.New("watermill backend: closed")
)

// Config configures a [Backend]. Set Publish.Publisher and exactly one of
// Subscriber and NewSubscriber.
type Config struct {
	// Publish is the forwarder's side, as package watermillpub makes it
	// (Publisher is required; Topic, Classify and the payload limit are
	// optional): see that package for what the adapter keeps of the
	// forwarder's broker contract. The backend never closes the Publisher.
	Publish watermillpub.Config
	// Subscriber is one subscriber for every consumer group, with no groups
	// of its own: every Subscribe of it receives every message of the topic
	// (a GoChannel, or the Publisher itself when it is both). The backend
	// provides the groups, within this Backend (so within one process): a
	// group's consumers share one subscription per topic and each message
	// goes to one of them. The backend never closes it: closing a group's
	// subscriber ends that group's subscriptions only, and closing the
	// Backend ends all of them.
	Subscriber message.Subscriber
	// NewSubscriber returns a new subscriber for one consumer of group (the
	// arguments of [brokers.Backend.Subscriber]), of its own: closing it
	// must not end another group's subscriptions nor the Publisher (one it
	// returned before is refused with [ErrSharedSubscriber]). The
	// groups are its job: each group reads every message, and consumers of
	// one group share them (watermill-sql's SubscriberConfig.ConsumerGroup,
	// Kafka's consumer group, a NATS queue group, a RabbitMQ queue per
	// group). opts has its defaults set (InFlight, ClaimIdle): apply what
	// the subscriber has. The backend hands the subscriber to the caller,
	// who closes it.
	NewSubscriber func(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error)
	// Topics lists the broker topics a consumer of topic reads, which must
	// be those Publish.Topic sends topic's messages to. Defaults to topic
	// alone; required when Publish.Topic is set.
	Topics func(topic string) []string
	// Kind names the backend (the worker's metrics and spans). Defaults to
	// [Kind].
	Kind brokers.Kind
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Backend is a [brokers.Backend] over a Watermill publisher and subscriber.
type Backend struct {
	cfg    Config
	broker forwarder.Broker
	seq    *sequencer // numbers the messages of a GoChannel Subscriber

	mu     sync.Mutex
	closed bool
	hubs   map[hubKey]*hub // Config.Subscriber's subscriptions, one per group and topic
	// given holds the pointers Config.NewSubscriber returned, so that one
	// returned again (a subscriber built outside the factory, handed to
	// every group) is refused. Kept for the Backend's life: whether the
	// caller closed one is not seen, and a pointer forgotten could be the
	// shared one coming back.
	given map[any]struct{}
}

var _ brokers.Backend = (*Backend)(nil)

// New validates cfg, sets its defaults and returns the backend. It refuses
// a GoChannel (as Publisher or Subscriber) that is not Persistent
// ([ErrLosesMessages]).
func New(cfg Config) (*Backend, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Backend{cfg: cfg, hubs: map[hubKey]*hub{}, given: map[any]struct{}{}}
	pub := cfg.Publish
	if gc, ok := cfg.Subscriber.(*gochannel.GoChannel); ok {
		b.seq = sequencerOf(gc)
		pub.Publisher = numbered{Publisher: pub.Publisher, seq: b.seq}
	}
	var err error
	if b.broker, err = watermillpub.New(pub); err != nil {
		return nil, fmt.Errorf("watermill backend: %w", err)
	}
	return b, nil
}

func (c *Config) setDefaults() {
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.Kind = cmp.Or(c.Kind, Kind)
	if c.Topics == nil && c.Publish.Topic == nil { // else required
		c.Topics = func(topic string) []string { return []string{topic} }
	}
}

func (c *Config) validate() error {
	var errs configcheck.Errors
	errs.Check(c.Publish.Publisher != nil, "Publish.Publisher", "is required")
	errs.Check((c.Subscriber == nil) != (c.NewSubscriber == nil), "Subscriber",
		"set exactly one of Subscriber (one subscriber without groups, shared) and NewSubscriber (one per consumer, with groups)")
	errs.Check(c.Topics != nil, "Topics", "is required with Publish.Topic: consumers must read the topics it publishes to")
	if err := checkGoChannel(c.Publish.Publisher, "Config.Publish.Publisher", c.Logger); err != nil {
		errs = append(errs, err)
	}
	if err := checkGoChannel(c.Subscriber, "Config.Subscriber", c.Logger); err != nil {
		errs = append(errs, err)
	}
	_, pubGC := c.Publish.Publisher.(*gochannel.GoChannel)
	_, subGC := c.Subscriber.(*gochannel.GoChannel)
	errs.Check(!pubGC || !subGC || same(c.Publish.Publisher, c.Subscriber), "Subscriber",
		"must be Publish.Publisher when both are GoChannels: a GoChannel delivers only what was published to it")
	return errs.Err("watermill backend config")
}

// Kind is Config.Kind.
func (b *Backend) Kind() brokers.Kind { return b.cfg.Kind }

// Broker is the forwarder's side: package watermillpub's broker over
// Config.Publish.
func (b *Backend) Broker() forwarder.Broker { return b.broker }

// Topics is Config.Topics.
func (b *Backend) Topics(topic string) []string { return b.cfg.Topics(topic) }

// Subscriber returns a subscriber of group: over Config.Subscriber, one
// whose Close ends its own subscriptions only and that holds opts.InFlight
// messages unsettled at most; else Config.NewSubscriber's, checked not to
// be shared.
func (b *Backend) Subscriber(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
	if group == "" {
		return nil, errors.New("watermill backend: a consumer group is required")
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if b.cfg.Subscriber != nil {
		return newGroupSubscriber(b, group, opts.WithDefaults().InFlight), nil
	}
	sub, err := b.cfg.NewSubscriber(group, consumer, opts.WithDefaults())
	if err != nil {
		return nil, fmt.Errorf("watermill backend: subscriber of group %q: %w", group, err)
	}
	if sub == nil {
		return nil, fmt.Errorf("watermill backend: NewSubscriber returned no subscriber for group %q", group)
	}
	// A GoChannel is one pubsub: a new one per group would receive
	// nothing the Publisher sent, and the Publisher's own would be closed
	// by the first group that stops.
	_, gc := sub.(*gochannel.GoChannel)
	if gc || same(sub, b.cfg.Publish.Publisher) {
		// Left open: it is shared, so closing it is what the refusal
		// is there to prevent.
		return nil, fmt.Errorf("%w (%T): closing it when group %q stops would stop every group; pass it as Config.Subscriber, which the backend shares among the groups and never closes", ErrSharedSubscriber, sub, group)
	}
	// Only pointers are remembered: == on other dynamic types may panic,
	// and a value type cannot be one subscriber shared.
	if reflect.TypeOf(sub).Kind() == reflect.Pointer {
		b.mu.Lock()
		_, again := b.given[sub]
		b.given[sub] = struct{}{}
		b.mu.Unlock()
		if again {
			// Left open, as above: an earlier group reads through it.
			return nil, fmt.Errorf("%w (%T): NewSubscriber returned for group %q a subscriber it returned before; the first group to stop would close it for all: build a new one in each call", ErrSharedSubscriber, sub, group)
		}
	}
	return sub, nil
}

// Close ends the subscriptions still open on Config.Subscriber (their
// channels close) and refuses new subscribers. It closes neither the
// Publisher nor the Subscriber: they are the caller's, who may share them
// with other code; close them after the Backend.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for k, h := range b.hubs {
		h.cancel()
		delete(b.hubs, k)
	}
	return nil
}

// same reports whether a and b are the same pointer: the only values the
// check compares, as == on other dynamic types may panic.
func same(a, b any) bool {
	if a == nil || b == nil {
		return false
	}
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Kind() == reflect.Pointer && a == b
}

// checkGoChannel refuses a GoChannel that drops messages and warns of one
// whose publishes wait for the consumers. GoChannel keeps its Config unexported, so it is read by
// reflection; a GoChannel whose fields changed (another Watermill version)
// is let through with a warning.
func checkGoChannel(v any, field string, logger *slog.Logger) error {
	gc, ok := v.(*gochannel.GoChannel)
	if !ok || gc == nil {
		return nil
	}
	cfg := reflect.ValueOf(gc).Elem().FieldByName("config")
	var persistent, blocking reflect.Value
	if cfg.IsValid() && cfg.Kind() == reflect.Struct {
		persistent, blocking = cfg.FieldByName("Persistent"), cfg.FieldByName("BlockPublishUntilSubscriberAck")
	}
	if !persistent.IsValid() || persistent.Kind() != reflect.Bool || !blocking.IsValid() || blocking.Kind() != reflect.Bool {
		logger.Warn("watermill backend: cannot read the GoChannel's settings (another Watermill version?): it must be Persistent, or it drops messages", "field", field)
		return nil
	}
	if !persistent.Bool() {
		return fmt.Errorf("%w: %s is a GoChannel with gochannel.Config.Persistent false: it drops what is published to a topic with no subscription yet (a consumer group not started, or between two of its subscriptions) while the forwarder marks the outbox row published; set Persistent: true", ErrLosesMessages, field)
	}
	if blocking.Bool() {
		logger.Warn("watermill backend: the GoChannel has BlockPublishUntilSubscriberAck: every publish of the forwarder waits until each group subscribed to the topic has handled the message, so the slowest group sets the pace of all", "field", field)
	}
	return nil
}
