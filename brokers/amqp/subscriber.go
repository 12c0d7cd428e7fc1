package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/redact"
	"github.com/outflow-dev/outflow/internal/subloop"
)

// amqpSubscriber is a consumer group's Watermill subscriber on RabbitMQ:
// each subscription is one AMQP channel consuming the group's queue on the
// exchange, with a prefetch of InFlight, and every prefetched message is
// handed out at once so the middleware can share transactions among them
// (watermill-amqp's subscriber hands out one message and waits for its
// ack). A message is acked on the server after it was acked; a nacked one
// is held NackDelay, then requeued. When the connection drops, RabbitMQ
// requeues what was unacked and the subscription reconnects by itself,
// with backoff, until its context ends (watermill-amqp's reconnection
// races on its connection state: ThreeDotsLabs/watermill#693). The
// subscriptions of one subscriber share one connection.
type amqpSubscriber struct {
	b         *amqpBackend
	group     string
	name      string // connection name, shown in the management UI
	prefetch  int
	nackDelay time.Duration
	log       watermill.LoggerAdapter

	mu   sync.Mutex // guards conn
	conn *amqp091.Connection

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// amqpCloseWait bounds how long Close waits for the handler of a message in
// flight to ack it.
const amqpCloseWait = 15 * time.Second

func (b *amqpBackend) Subscriber(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
	opts = opts.WithDefaults()
	if group == "" {
		return nil, errors.New("RabbitMQ subscriber: group is required")
	}
	return &amqpSubscriber{
		b: b, group: group, name: "outflow-" + group + "-" + consumer,
		prefetch: min(opts.InFlight, 65535), nackDelay: b.cfg.AMQP.NackDelay,
		log: watermill.NewSlogLogger(b.cfg.Logger), closing: make(chan struct{}),
	}, nil
}

// connection returns the subscriber's connection, dialing a new one when
// there is none or it was lost.
func (s *amqpSubscriber) connection() (*amqp091.Connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	select {
	case <-s.closing:
		return nil, errors.New("RabbitMQ subscriber is closed")
	default:
	}
	conn, err := amqp091.DialConfig(s.b.cfg.AMQP.URL, *s.b.amqpConfig(s.name))
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ at %s: %w", redact.URL(s.b.cfg.AMQP.URL), err)
	}
	s.conn = conn
	return conn, nil
}

// declare declares exchange, the group's queue on it and their binding, as
// the forwarder does: redeclaring what exists is a no-op for the server.
func (s *amqpSubscriber) declare(ch *amqp091.Channel, exchange string) (string, error) {
	queue := brokers.AMQPQueueName(exchange, s.group)
	if err := s.b.wcfg.TopologyBuilder.ExchangeDeclare(ch, exchange, s.b.wcfg); err != nil {
		return "", fmt.Errorf("declare RabbitMQ exchange %q: %w", exchange, err)
	}
	params := wmamqp.BuildTopologyParams{Topic: exchange, QueueName: queue, ExchangeName: exchange}
	if err := s.b.wcfg.TopologyBuilder.BuildTopology(ch, params, s.b.wcfg, s.log); err != nil {
		return "", fmt.Errorf("declare RabbitMQ queue %q: %w", queue, err)
	}
	return queue, nil
}

// SubscribeInitialize declares the group's queue on exchange and binds it,
// so that what is published from now on is kept for the group even before
// it subscribes.
func (s *amqpSubscriber) SubscribeInitialize(exchange string) error {
	conn, err := s.connection()
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open RabbitMQ channel: %w", err)
	}
	defer ch.Close()
	_, err = s.declare(ch, exchange)
	return err
}

// consume opens a channel and starts consuming the group's queue on
// exchange.
func (s *amqpSubscriber) consume(exchange string) (*amqp091.Channel, <-chan amqp091.Delivery, error) {
	conn, err := s.connection()
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open RabbitMQ channel: %w", err)
	}
	queue, err := s.declare(ch, exchange)
	if err == nil {
		err = ch.Qos(s.prefetch, 0, false)
	}
	var deliveries <-chan amqp091.Delivery
	if err == nil {
		deliveries, err = ch.Consume(queue, "", false, false, false, false, nil)
	}
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("consume RabbitMQ queue %q: %w", queue, err)
	}
	return ch, deliveries, nil
}

// Subscribe consumes the group's queue on exchange (declaring both) until
// ctx is done or Close is called; the channel is closed then. Failing to
// reach RabbitMQ now is an error; losing it later is survived.
func (s *amqpSubscriber) Subscribe(ctx context.Context, exchange string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, errors.New("RabbitMQ subscriber is closed")
	default:
	}
	ch, deliveries, err := s.consume(exchange)
	if err != nil {
		return nil, fmt.Errorf("subscribe to RabbitMQ exchange %q: %w", exchange, err)
	}
	fields := watermill.LogFields{"exchange": exchange, "group": s.group}
	return subloop.Start(ctx, s.closing, &s.wg, func(ctx context.Context, out chan<- *message.Message) {
		failures := 0
		for {
			s.deliver(ctx, ch, deliveries, out, fields)
			_ = ch.Close() // requeues what is still unacked
			if ctx.Err() != nil {
				return
			}
			for {
				failures++
				if !subloop.Sleep(ctx, backoff.Reconnect(failures)) {
					return
				}
				if ch, deliveries, err = s.consume(exchange); err == nil {
					break
				}
				s.log.Error("RabbitMQ subscription lost, reconnecting", err, fields)
			}
			failures = 0
			s.log.Info("RabbitMQ subscription resumed", fields)
		}
	}), nil
}

// deliver hands out each delivery as it comes and settles it on ch when
// its ack or nack comes, until deliveries ends (the channel or connection
// was lost) or ctx is done. It returns once every message it handed out is
// settled, or was given amqpCloseWait to be.
func (s *amqpSubscriber) deliver(ctx context.Context, ch *amqp091.Channel, deliveries <-chan amqp091.Delivery, out chan<- *message.Message, fields watermill.LogFields) {
	var settling sync.WaitGroup
	defer settling.Wait()
	for {
		var d amqp091.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
		case <-ctx.Done():
			return
		}
		if !ok {
			if ctx.Err() == nil {
				s.log.Error("RabbitMQ subscription lost, reconnecting", errors.New("delivery channel closed"), fields)
			}
			return
		}
		msg, err := wmamqp.DefaultMarshaler{}.Unmarshal(d)
		if err != nil {
			// Not a Watermill message: no redelivery could decode it.
			s.log.Error("undecodable message rejected", err, fields)
			_ = d.Reject(false)
			continue
		}
		// The message's context ends when it is settled, or when the
		// subscription stops, as Watermill subscribers' do.
		mctx, cancel := context.WithCancel(ctx)
		msg.SetContext(mctx)
		select {
		case out <- msg:
		case <-ctx.Done():
			cancel()
			return // not handed out: the channel's close requeues it
		}
		settling.Go(func() {
			defer cancel()
			if err := s.settle(ctx, msg, d); err != nil && !errors.Is(err, amqp091.ErrClosed) {
				s.log.Error("settle; RabbitMQ will redeliver the message", err, fields)
			}
		})
	}
}

// settle acks or (after nackDelay) nacks d as msg is. When the
// subscription stops first, the handler has amqpCloseWait to ack.
func (s *amqpSubscriber) settle(ctx context.Context, msg *message.Message, d amqp091.Delivery) error {
	select {
	case <-msg.Acked():
		return d.Ack(false)
	case <-msg.Nacked():
	case <-ctx.Done():
		t := time.NewTimer(amqpCloseWait)
		defer t.Stop()
		select {
		case <-msg.Acked():
			return d.Ack(false)
		case <-msg.Nacked():
		case <-t.C:
		}
		return nil // the channel's close requeues it
	}
	if !subloop.Sleep(ctx, s.nackDelay) {
		return nil
	}
	return d.Nack(false, true)
}

// Close stops the subscriptions, lets the messages in flight be acked (up
// to amqpCloseWait), then closes the connection: RabbitMQ requeues what was
// not acked. It is safe to call more than once.
func (s *amqpSubscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	err := s.conn.Close()
	s.conn = nil
	if err != nil && !errors.Is(err, amqp091.ErrClosed) {
		return err
	}
	return nil
}
