package amqp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/amqp"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

var amqpQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openAMQPTest(t *testing.T, url string, groups map[string][]string) brokers.Backend {
	t.Helper()
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.AMQP, Logger: amqpQuiet,
		AMQP: brokers.AMQPConfig{URL: url, Prefix: testservers.AMQPPrefix(t, 1, groups), Groups: groups,
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
	b := openAMQPTest(t, testservers.AMQPURL(), map[string][]string{"nobody": nil})
	errs := b.Broker().Publish(context.Background(), amqpOutgoing("nobody", "m1"))
	require.ErrorIs(t, errs[0], amqp.ErrUnroutable)
	require.NotErrorIs(t, errs[0], forwarder.ErrBrokerUnavailable)
}

// A queue declared for a group keeps what was published before its first
// subscriber; a nacked message comes back after NackDelay, not at once.
func TestAMQPQueueBeforeSubscriberAndNackDelay(t *testing.T) {
	t.Parallel()
	b := openAMQPTest(t, testservers.AMQPURL(), map[string][]string{"events": {"g"}})
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
// next publish reconnects. The loss is a proxy's, not the shared server's.
func TestAMQPConnectionLossIsUnavailableThenRecovers(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testservers.AMQPURL())
	require.NoError(t, err)
	p := testservers.StartProxy(t, u.Host)
	u.Host = p.Addr
	b := openAMQPTest(t, u.String(), map[string][]string{"events": {"g"}})
	for _, err := range b.Broker().Publish(context.Background(), amqpOutgoing("events", "m1")) {
		require.NoError(t, err)
	}

	p.Stop()
	outflowtest.WaitFor(t, 10*time.Second, "a publish to fail as unavailable", func() bool {
		err := b.Broker().Publish(context.Background(), amqpOutgoing("events", "m2"))[0]
		if err != nil {
			require.ErrorIs(t, err, forwarder.ErrBrokerUnavailable)
		}
		return err != nil
	})
	p.Start()
	outflowtest.WaitFor(t, 10*time.Second, "a publish to succeed again", func() bool {
		return b.Broker().Publish(context.Background(), amqpOutgoing("events", "m3"))[0] == nil
	})
}

// Two instances of a group on one partition's queue: one consumes, in
// publish order, while the other stands by (x-single-active-consumer);
// when the active one closes, the standby takes over with what it had not
// acked.
func TestAMQPSingleActiveConsumerPerQueue(t *testing.T) {
	t.Parallel()
	b := openAMQPTest(t, testservers.AMQPURL(), map[string][]string{"events": {"g"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subscribe := func(name string) (message.Subscriber, <-chan *message.Message) {
		sub, err := b.Subscriber("g", name, brokers.SubscriberOptions{InFlight: 10})
		require.NoError(t, err)
		t.Cleanup(func() { sub.Close() })
		ch, err := sub.Subscribe(ctx, b.Topics("events")[0])
		require.NoError(t, err)
		return sub, ch
	}
	first, firstCh := subscribe("c1")
	_, standbyCh := subscribe("c2")
	var batch []forwarder.Outgoing
	for i := range 20 {
		batch = append(batch, amqpOutgoing("events", fmt.Sprintf("m%02d", i))...)
	}
	for _, err := range b.Broker().Publish(ctx, batch) {
		require.NoError(t, err)
	}
	for i := range 5 {
		m := <-firstCh
		require.Equal(t, fmt.Sprintf("m%02d", i), m.UUID, "publish order")
		m.Ack()
	}
	select {
	case m := <-standbyCh:
		t.Fatalf("the standby got %s while the active consumer ran", m.UUID)
	default:
	}
	// The first holds m05..m14 (its prefetch), none handed out yet:
	// closing it gives them back.
	closed := make(chan error, 1)
	go func() { closed <- first.Close() }()
	for i := 5; i < 20; i++ {
		m := <-standbyCh
		require.NotNil(t, m)
		require.Equal(t, fmt.Sprintf("m%02d", i), m.UUID, "the standby resumes where the active one stopped, in order")
		m.Ack()
	}
	require.NoError(t, <-closed)
}

// The contract, with no Groups: nothing is declared at publish time, and
// the suite's subscriber declares its group's queue before the first
// publish, as a worker does.
func TestBrokerContract(t *testing.T) {
	t.Parallel()
	target := func(t *testing.T, url string) brokertest.Target {
		topics := map[string][]string{} // filled as the suite subscribes, read by AMQPPrefix's cleanup
		b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.AMQP, Logger: amqpQuiet,
			AMQP: brokers.AMQPConfig{URL: url, Prefix: testservers.AMQPPrefix(t, 1, topics), NackDelay: 100 * time.Millisecond}})
		require.NoError(t, err)
		t.Cleanup(func() { b.Close() })
		target := brokertest.BackendTarget(t, b)
		subscribe := target.Subscribe
		target.Subscribe = func(t *testing.T, topic string) <-chan *message.Message {
			topics[topic] = []string{brokertest.Group}
			return subscribe(t, topic)
		}
		return target
	}
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target { return target(t, testservers.AMQPURL()) },
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			u, err := url.Parse(testservers.AMQPURL())
			require.NoError(t, err)
			p := testservers.StartProxy(t, u.Host)
			u.Host = p.Addr
			return target(t, u.String()), p
		},
	})
}

// unopened is a Backend never called: Groups needs no broker.
type unopened struct{ brokers.Backend }

// A user's handler on a topic of the user's: with the forwarder given the
// Worker's Groups, what is published before the handler's first
// subscription waits in its queue; with no Groups, nothing is declared (no
// default names anybody's handlers) and the publish is unroutable.
func TestWorkerGroupsMakeAUserTopicRoutable(t *testing.T) {
	t.Parallel()
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: outflowtest.NewSchema(t).Pool, Broker: unopened{},
		Registry: events.NewRegistry(), Logger: amqpQuiet})
	require.NoError(t, err)
	require.NoError(t, w.Add(consumer.Handler{Name: "ship-order", Topic: "orders",
		Func: func(context.Context, pgx.Tx, events.Event) error { return nil }}))
	require.Equal(t, map[string][]string{"orders": {"ship-order"}, consumer.ReplayTopic("ship-order"): {"ship-order"}}, w.Groups())

	none, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.AMQP, Logger: amqpQuiet,
		AMQP: brokers.AMQPConfig{URL: testservers.AMQPURL(), Prefix: testservers.AMQPPrefix(t, 1, map[string][]string{"orders": nil, "payments": nil})}})
	require.NoError(t, err)
	t.Cleanup(func() { none.Close() })
	for _, topic := range []string{"orders", "payments"} { // payments: the reference app's topic
		require.ErrorIs(t, none.Broker().Publish(context.Background(), amqpOutgoing(topic, "m0"))[0], amqp.ErrUnroutable,
			"nil Groups declares no queue")
	}

	b := openAMQPTest(t, testservers.AMQPURL(), w.Groups())
	for _, err := range b.Broker().Publish(context.Background(), amqpOutgoing("orders", "m1")) {
		require.NoError(t, err)
	}
	sub, err := b.Subscriber("ship-order", "c1", brokers.SubscriberOptions{})
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, b.Topics("orders")[0])
	require.NoError(t, err)
	select {
	case m := <-ch:
		require.Equal(t, "m1", m.UUID, "published before the first subscription, kept for the group")
		m.Ack()
	case <-ctx.Done():
		t.Fatal("the message published before the group's first subscription was lost")
	}
}

// lagBackend records the topics a test uses, for AMQPPrefix's cleanup.
type lagBackend struct {
	brokers.Backend
	topics map[string][]string
}

func (b lagBackend) Topics(topic string) []string {
	b.topics[topic] = []string{brokertest.Group}
	return b.Backend.Topics(topic)
}

func (b lagBackend) Lag(ctx context.Context, group, topic string) (brokers.Lag, error) {
	return b.Backend.(brokers.LagReporter).Lag(ctx, group, topic)
}

func (b lagBackend) Ping(ctx context.Context) error { return b.Backend.(brokers.Pinger).Ping(ctx) }

// Lag (ready messages only, no age) and Ping, on two partitions; the
// outage is a proxy's in front of RabbitMQ.
func TestObserveContract(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T, url string) brokers.Backend {
		topics := map[string][]string{}
		b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.AMQP, Logger: amqpQuiet, StreamPartitions: 2,
			AMQP: brokers.AMQPConfig{URL: url, Prefix: testservers.AMQPPrefix(t, 2, topics), NackDelay: 100 * time.Millisecond}})
		require.NoError(t, err)
		t.Cleanup(func() { b.Close() })
		return lagBackend{Backend: b, topics: topics}
	}
	brokertest.RunObserve(t, brokertest.ObserveHarness{
		NoOldestAge: true,
		Open:        func(t *testing.T) brokers.Backend { return open(t, testservers.AMQPURL()) },
		Outage: func(t *testing.T) (brokers.Backend, testservers.Outage) {
			u, err := url.Parse(testservers.AMQPURL())
			require.NoError(t, err)
			p := testservers.StartProxy(t, u.Host)
			u.Host = p.Addr
			return open(t, u.String()), p
		},
	})
}

// A queue not declared yet lags by nothing, and asking does not declare it.
func TestLagDeclaresNothing(t *testing.T) {
	t.Parallel()
	topics := map[string][]string{"orders": {"g"}}
	prefix := testservers.AMQPPrefix(t, 1, topics)
	b, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.AMQP, Logger: amqpQuiet,
		AMQP: brokers.AMQPConfig{URL: testservers.AMQPURL(), Prefix: prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	for range 2 { // the second after the server closed the first's channel
		lag, err := b.(brokers.LagReporter).Lag(context.Background(), "g", "orders")
		require.NoError(t, err)
		require.Equal(t, brokers.Lag{}, lag)
	}
	require.NoError(t, b.(brokers.Pinger).Ping(context.Background()), "the publishing channel survives")
	require.ErrorIs(t, b.Broker().Publish(context.Background(), amqpOutgoing("orders", "m1"))[0], amqp.ErrUnroutable,
		"Lag declared the queue")
}
