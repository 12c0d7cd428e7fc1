package brokers_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

var amqpQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openAMQPTest(t *testing.T, url string, groups map[string][]string) brokers.Backend {
	t.Helper()
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.AMQP, Logger: amqpQuiet,
		AMQP: brokers.AMQPConfig{URL: url, Prefix: outflowtest.AMQPPrefix(t, 1, groups), Groups: groups,
			NackDelay: 300 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func amqpOutgoing(topic, id string) []forwarder.Outgoing {
	return []forwarder.Outgoing{{Topic: topic, AggregateID: "a1", Message: message.NewMessage(id, []byte(`{}`))}}
}

// A message no queue would take is the row's failure, not an outage.
func TestAMQPUnroutableIsReported(t *testing.T) {
	t.Parallel()
	b := openAMQPTest(t, outflowtest.AMQPURL(), map[string][]string{"nobody": nil})
	errs := b.Broker().Publish(context.Background(), amqpOutgoing("nobody", "m1"))
	require.ErrorIs(t, errs[0], brokers.ErrUnroutable)
	require.NotErrorIs(t, errs[0], forwarder.ErrBrokerUnavailable)
}

// A queue declared for a group keeps what was published before its first
// subscriber; a nacked message comes back after NackDelay, not at once.
func TestAMQPQueueBeforeSubscriberAndNackDelay(t *testing.T) {
	t.Parallel()
	b := openAMQPTest(t, outflowtest.AMQPURL(), map[string][]string{"events": {"g"}})
	for _, err := range b.Broker().Publish(context.Background(), amqpOutgoing("events", "m1")) {
		require.NoError(t, err)
	}
	sub, err := b.Subscriber("g", "c1", brokers.SubscriberOptions{InFlight: 4})
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, b.Topics("events")[0])
	require.NoError(t, err)
	first := <-ch
	require.NotNil(t, first)
	require.Equal(t, "m1", first.UUID)
	nacked := time.Now()
	first.Nack()
	again := <-ch
	require.NotNil(t, again)
	require.Equal(t, "m1", again.UUID)
	require.GreaterOrEqual(t, time.Since(nacked), 250*time.Millisecond, "redelivered after NackDelay")
	again.Ack()
}

// A connection lost mid-run fails the publish as broker unavailable; the
// next publish reconnects. The loss is a amqpProxy's, not the shared server's.
func TestAMQPConnectionLossIsUnavailableThenRecovers(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(outflowtest.AMQPURL())
	require.NoError(t, err)
	p := newAMQPProxy(t, u.Host)
	u.Host = p.addr
	b := openAMQPTest(t, u.String(), map[string][]string{"events": {"g"}})
	for _, err := range b.Broker().Publish(context.Background(), amqpOutgoing("events", "m1")) {
		require.NoError(t, err)
	}

	p.cut()
	outflowtest.WaitFor(t, 10*time.Second, "a publish to fail as unavailable", func() bool {
		err := b.Broker().Publish(context.Background(), amqpOutgoing("events", "m2"))[0]
		if err != nil {
			require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
		}
		return err != nil
	})
	p.resume()
	outflowtest.WaitFor(t, 10*time.Second, "a publish to succeed again", func() bool {
		return b.Broker().Publish(context.Background(), amqpOutgoing("events", "m3"))[0] == nil
	})
}

// amqpProxy forwards TCP to target; cut drops every connection and refuses new
// ones until resume.
type amqpProxy struct {
	addr   string
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newAMQPProxy(t *testing.T, target string) *amqpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &amqpProxy{addr: ln.Addr().String(), target: target}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			down := p.down
			p.mu.Unlock()
			if down {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

func (p *amqpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *amqpProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}
