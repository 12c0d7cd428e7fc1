package amqp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/redact"
)

func init() { brokers.Register(brokers.AMQP, open) }

// ErrUnroutable is returned for a message RabbitMQ returned because no queue
// is bound to its exchange: no group in [brokers.AMQPConfig.Groups] for its
// topic and no worker has subscribed yet. It is the row's failure (retried, then
// parked), not an outage.
var ErrUnroutable = errors.New("no queue bound to the exchange")

// A broker topic (a topic, or one of its partitions) is a durable fanout
// exchange of that name; each consumer group has a durable queue bound to
// it, named [brokers.AMQPQueueName], which the group's instances share (competing
// consumers). Messages are persistent, published with publisher confirms
// and the mandatory flag: Publish returns nil only once RabbitMQ confirmed
// the message, and a message no queue took is returned as [ErrUnroutable].
// The forwarder's publishing is Outflow's own (one channel in confirm mode,
// pipelined, in order) because watermill-amqp's publisher waits for each
// confirm in turn and ignores returns; the wire format is watermill-amqp's
// (its DefaultMarshaler). The workers' subscriber is Outflow's own too
// ([amqpSubscriber]).
type amqpBackend struct {
	cfg  brokers.Config
	wcfg wmamqp.Config
	log  watermill.LoggerAdapter

	mu       sync.Mutex // serialises Publish: one channel, one order
	conn     *amqp091.Connection
	ch       *amqp091.Channel
	returns  chan amqp091.Return
	prepared map[string]bool
	// defaultMax is the default max_message_size of the server's version,
	// set at each connect; read without mu by the writer and forwarder.
	defaultMax atomic.Int64
}

// amqpWindow bounds the messages awaiting confirmation on the channel.
const amqpWindow = 256

// open opens the amqp backend of cfg (its AMQP block), whose defaults
// [brokers.Open] has set.
func open(ctx context.Context, cfg brokers.Config) (brokers.Backend, error) {
	a := &cfg.AMQP
	if a.URL == "" {
		a.URL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if a.NackDelay <= 0 {
		a.NackDelay = time.Second
	}
	if a.ConnectTimeout <= 0 {
		a.ConnectTimeout = 3 * time.Second
	}
	b := &amqpBackend{cfg: cfg, log: watermill.NewSlogLogger(cfg.Logger), prepared: map[string]bool{}}
	b.wcfg = wmamqp.NewDurablePubSubConfig(a.URL, nil)
	b.wcfg.Exchange.Type = "fanout"
	if !a.CompetingConsumers {
		b.wcfg.Queue.Arguments = amqp091.Table{"x-single-active-consumer": true}
	}
	b.wcfg.Connection.AmqpConfig = b.amqpConfig("outflow")
	b.wcfg.Connection.Reconnect = &wmamqp.ReconnectConfig{
		BackoffInitialInterval: backoff.ReconnectBase, BackoffRandomizationFactor: 0.5,
		BackoffMultiplier: 1.5, BackoffMaxInterval: backoff.ReconnectMax,
	}
	if err := b.connect(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *amqpBackend) amqpConfig(name string) *amqp091.Config {
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(name)
	return &amqp091.Config{
		Heartbeat:  10 * time.Second,
		Properties: props,
		Dial:       amqp091.DefaultDial(b.cfg.AMQP.ConnectTimeout),
	}
}

// connect (re)opens the publishing connection and its confirm channel.
// Called with mu held, or before the backend is shared.
func (b *amqpBackend) connect(ctx context.Context) error {
	fail := func(err error) error {
		return fmt.Errorf("connect to RabbitMQ at %s: %w (is it running? try `make services-up`)", redact.URL(b.cfg.AMQP.URL), err)
	}
	if b.conn != nil {
		_ = b.conn.Close()
	}
	b.conn, b.ch = nil, nil
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	conf := b.amqpConfig("outflow-forwarder")
	timeout := b.cfg.AMQP.ConnectTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	conf.Dial = func(network, addr string) (net.Conn, error) {
		return amqp091.DefaultDial(timeout)(network, addr)
	}
	conn, err := amqp091.DialConfig(b.cfg.AMQP.URL, *conf)
	if err != nil {
		return fail(err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return fail(err)
	}
	b.conn, b.ch = conn, ch
	b.defaultMax.Store(int64(defaultMaxMessageBytes(conn)))
	b.returns = ch.NotifyReturn(make(chan amqp091.Return, amqpWindow))
	return nil
}

func (b *amqpBackend) Kind() brokers.Kind { return brokers.AMQP }

func (b *amqpBackend) Topics(topic string) []string {
	return brokers.PartitionTopics(b.cfg.AMQP.Prefix, topic, b.cfg.StreamPartitions)
}

// prepare declares topic's exchanges and binds the queues of its groups,
// once per connection; redeclaring what exists is a no-op for the server.
func (b *amqpBackend) prepare(topic string) error {
	if b.prepared[topic] {
		return nil
	}
	for _, exchange := range b.Topics(topic) {
		if err := b.wcfg.TopologyBuilder.ExchangeDeclare(b.ch, exchange, b.wcfg); err != nil {
			return fmt.Errorf("declare RabbitMQ exchange %q: %w", exchange, err)
		}
		for _, group := range b.cfg.AMQP.Groups[topic] {
			params := wmamqp.BuildTopologyParams{Topic: exchange, QueueName: brokers.AMQPQueueName(exchange, group), ExchangeName: exchange}
			if err := b.wcfg.TopologyBuilder.BuildTopology(b.ch, params, b.wcfg, b.log); err != nil {
				return fmt.Errorf("declare RabbitMQ queue %q: %w", params.QueueName, err)
			}
		}
	}
	b.prepared[topic] = true
	return nil
}

func (b *amqpBackend) Broker() forwarder.Broker {
	return brokers.WithCloudEvents(amqpBroker{b}, cloudevents.AMQP, b.cfg.CloudEvents)
}

type amqpBroker struct{ b *amqpBackend }

// Publish sends the messages in order on one confirm channel, up to
// amqpWindow before waiting for their confirms. A lost connection fails
// the rest of the batch as unavailable; the next call reconnects.
func (ab amqpBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	b := ab.b
	b.mu.Lock()
	defer b.mu.Unlock()
	errs := make([]error, len(msgs))
	down := func(from int, err error) {
		for i := from; i < len(msgs); i++ {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("%w: %w", forwarder.ErrBrokerUnavailable, err)
			}
		}
	}
	if b.ch == nil || b.ch.IsClosed() {
		if err := b.connect(ctx); err != nil {
			down(0, err)
			return errs
		}
		b.prepared = map[string]bool{}
	}
	for start := 0; start < len(msgs); start += amqpWindow {
		window := msgs[start:min(start+amqpWindow, len(msgs))]
		b.drainReturns(nil)
		confirms := make([]*amqp091.DeferredConfirmation, len(window))
		for i, m := range window {
			if err := b.prepare(m.Topic); err != nil {
				down(start+i, err)
				break
			}
			pub, err := wmamqp.DefaultMarshaler{}.Marshal(m.Message)
			if err != nil {
				errs[start+i] = fmt.Errorf("marshal for RabbitMQ: %w", err)
				continue
			}
			pub.MessageId = m.Message.UUID
			b.contentType(&pub)
			exchange := brokers.PartitionTopic(b.cfg.AMQP.Prefix, m.Topic, b.cfg.StreamPartitions, m.AggregateID)
			confirms[i], err = b.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "", true, false, pub)
			if err != nil {
				down(start+i, fmt.Errorf("publish to RabbitMQ: %w", err))
				break
			}
		}
		for i, dc := range confirms {
			if dc == nil {
				continue
			}
			ok, err := dc.WaitContext(ctx)
			switch {
			case err != nil:
				down(start+i, fmt.Errorf("wait for the RabbitMQ confirm: %w", err))
			case !ok && b.ch.IsClosed():
				down(start+i, errors.New("RabbitMQ channel closed before the confirm"))
			case !ok:
				errs[start+i] = fmt.Errorf("%w: RabbitMQ nacked the message", forwarder.ErrBrokerUnavailable)
			}
		}
		// A return precedes its message's confirm on the wire, so every
		// return of the window is in the channel by now.
		returned := map[string]bool{}
		b.drainReturns(returned)
		for i, m := range window {
			if errs[start+i] == nil && returned[m.Message.UUID] {
				errs[start+i] = fmt.Errorf("%w %q (RabbitMQ returned message %s: list topic %q's groups in brokers.AMQPConfig.Groups, e.g. from consumer.Worker.Groups)",
					ErrUnroutable, brokers.PartitionTopic(b.cfg.AMQP.Prefix, m.Topic, b.cfg.StreamPartitions, m.AggregateID), m.Message.UUID, m.Topic)
			}
		}
		if b.ch.IsClosed() {
			down(start+len(window), errors.New("RabbitMQ channel closed"))
			break
		}
	}
	return errs
}

// drainReturns empties the returns channel, noting the message ids into
// ids when it is not nil.
func (b *amqpBackend) drainReturns(ids map[string]bool) {
	for {
		select {
		case r, ok := <-b.returns:
			if !ok {
				return
			}
			if ids != nil {
				ids[r.MessageId] = true
			}
		default:
			return
		}
	}
}

func (b *amqpBackend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn == nil {
		return nil
	}
	err := b.conn.Close()
	b.conn, b.ch = nil, nil
	if err != nil && !errors.Is(err, amqp091.ErrClosed) {
		return err
	}
	return nil
}
