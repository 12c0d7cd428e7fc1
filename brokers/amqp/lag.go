package amqp

import (
	"context"
	"errors"
	"fmt"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outflow-dev/outflow/brokers"
)

var (
	_ brokers.LagReporter = (*amqpBackend)(nil)
	_ brokers.Pinger      = (*amqpBackend)(nil)
)

// Ping opens a channel on the backend's connection (dialing it again when
// it was lost, as Publish does) and closes it: a round trip to the broker.
func (b *amqpBackend) Ping(ctx context.Context) error {
	err := b.withConn(ctx, func(conn *amqp091.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		return ch.Close()
	})
	if err != nil {
		return fmt.Errorf("amqp ping: %w", err)
	}
	return nil
}

// Lag sums the ready messages of group's queues on topic's exchanges, by a
// passive queue declare, which creates nothing (a queue that does not exist
// lags by nothing: what its exchange got before it was declared was not
// kept for the group). AMQP 0-9-1 tells only the ready count: messages
// delivered to a consumer and not acked yet are not counted, and the
// oldest message's age is not told at all (reading it would take it off
// the queue, or out of order), so OldestAge is always zero.
func (b *amqpBackend) Lag(ctx context.Context, group, topic string) (brokers.Lag, error) {
	var lag brokers.Lag
	for _, exchange := range b.Topics(topic) {
		queue := brokers.AMQPQueueName(exchange, group)
		err := b.withConn(ctx, func(conn *amqp091.Connection) error {
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			var amqpErr *amqp091.Error
			if errors.As(err, &amqpErr) && amqpErr.Code == amqp091.NotFound {
				return nil // the server closed the channel
			}
			if err != nil {
				_ = ch.Close()
				return err
			}
			lag.Events += int64(q.Messages)
			return ch.Close()
		})
		if err != nil {
			return brokers.Lag{}, fmt.Errorf("amqp lag of %s on %s: %w", group, queue, err)
		}
	}
	return lag, nil
}

// withConn runs f on the backend's connection, connecting first when it is
// lost, and returns when ctx is done even if f has not: amqp091's calls
// take no context, and a broker that stopped answering would hold them
// until the connection's heartbeat times out.
func (b *amqpBackend) withConn(ctx context.Context, f func(*amqp091.Connection) error) error {
	done := make(chan error, 1)
	go func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if err := ctx.Err(); err != nil {
			done <- err
			return
		}
		if b.conn == nil || b.conn.IsClosed() || b.ch == nil || b.ch.IsClosed() {
			if err := b.connect(ctx); err != nil {
				done <- err
				return
			}
			b.prepared = map[string]bool{}
		}
		done <- f(b.conn)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
