package nats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	outflownats "github.com/outflow-dev/outflow/brokers/nats"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// publish sends n new messages of topic, each its own aggregate, and fails
// t on any error; it returns their ids.
func publish(t *testing.T, b brokers.Backend, topic string, n int) []string {
	t.Helper()
	var (
		msgs []forwarder.Outgoing
		ids  []string
	)
	for range n {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		msgs = append(msgs, forwarder.Outgoing{Topic: topic, AggregateID: m.UUID, Message: m})
		ids = append(ids, m.UUID)
	}
	for _, err := range b.Broker().Publish(context.Background(), msgs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// publishEventually sends n new messages of topic as the forwarder does:
// what the broker cannot take now (forwarder.ErrBrokerUnavailable) is sent
// again until it is taken. It returns their ids.
func publishEventually(t *testing.T, b brokers.Backend, topic string, n int) []string {
	t.Helper()
	var msgs []forwarder.Outgoing
	for range n {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		msgs = append(msgs, forwarder.Outgoing{Topic: topic, AggregateID: m.UUID, Message: m})
	}
	left := msgs
	outflowtest.WaitFor(t, 20*time.Second, "the broker to take every message", func() bool {
		var retry []forwarder.Outgoing
		for i, err := range b.Broker().Publish(context.Background(), left) {
			switch {
			case errors.Is(err, forwarder.ErrBrokerUnavailable):
				retry = append(retry, left[i])
			case err != nil:
				t.Fatal(err)
			}
		}
		left = retry
		return len(left) == 0
	})
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.Message.UUID)
	}
	return ids
}

// A publish that finds its stream deleted creates it again, with the
// configured settings, and stores the message: the forwarder does not stall
// on "no responders" until an operator recreates the stream. Not at once:
// until the stream has been missing a while the broker is unavailable.
func TestPublishCreatesADeletedStreamAgain(t *testing.T) {
	t.Parallel()
	prefix := testservers.NATSPrefix(t)
	b := openBackend(t, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2,
		NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}})
	js := jetStream(t)
	publish(t, b, "orders", 3)
	if err := js.DeleteStream(prefix + "orders"); err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage(watermill.NewUUID(), []byte("x"))
	if err := b.Broker().Publish(context.Background(), []forwarder.Outgoing{{Topic: "orders", AggregateID: "a", Message: m}})[0]; !errors.Is(err, forwarder.ErrBrokerUnavailable) {
		t.Fatalf("a publish at once after the delete: got %v, want the broker unavailable", err)
	}
	publishEventually(t, b, "orders", 4)
	info, err := js.StreamInfo(prefix + "orders")
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 4 || info.Config.Replicas != 1 || info.Config.Storage != nats.FileStorage ||
		strings.Join(info.Config.Subjects, ",") != prefix+"orders,"+prefix+"orders.*" {
		t.Fatalf("stream created again with %d messages, config %+v", info.State.Msgs, info.Config)
	}
}

// Replicas outside JetStream's 1 to 5 are refused when the backend opens.
func TestReplicasAreValidated(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-1, 6} {
		_, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.NATS,
			NATS: brokers.NATSConfig{URL: testservers.NATSURL(), Replicas: n}})
		if err == nil || !strings.Contains(err.Error(), "Replicas") {
			t.Fatalf("Replicas %d: got %v", n, err)
		}
	}
}

// A subscriber whose stream was deleted (its durable consumer with it) and
// created again creates its consumer again and goes on delivering: what
// reaches the new stream reaches the group.
func TestSubscriberSurvivesARecreatedStream(t *testing.T) {
	t.Parallel()
	b, prefix, msgs := subscribeOrders(t)
	receive(t, msgs, publish(t, b, "orders", 3))

	js := jetStream(t)
	if err := js.DeleteStream(prefix + "orders"); err != nil {
		t.Fatal(err)
	}
	receive(t, msgs, publishEventually(t, b, "orders", 3)) // the publish creates the stream again
	if _, err := js.ConsumerInfo(prefix+"orders", "g_"+prefix+"orders"); err != nil {
		t.Fatalf("the durable consumer was not created again: %v", err)
	}
}

// A subscriber whose durable consumer alone was deleted creates it again.
func TestSubscriberSurvivesADeletedConsumer(t *testing.T) {
	t.Parallel()
	b, prefix, msgs := subscribeOrders(t)
	js := jetStream(t)
	// The server can fail a delete while it writes the consumer's state
	// ("unlinkat ...: directory not empty", seen under load): try again.
	var lastErr error
	outflowtest.WaitFor(t, 10*time.Second, "the durable consumer deleted", func() bool {
		lastErr = js.DeleteConsumer(prefix+"orders", "g_"+prefix+"orders")
		return lastErr == nil || errors.Is(lastErr, nats.ErrConsumerNotFound)
	})
	receive(t, msgs, publishEventually(t, b, "orders", 2))
	if _, err := js.ConsumerInfo(prefix+"orders", "g_"+prefix+"orders"); errors.Is(err, nats.ErrConsumerNotFound) {
		t.Fatal("the durable consumer was not created again")
	}
}

// subscribeOrders subscribes group "g" to the first partition of "orders"
// on streams of a prefix of the test's own.
func subscribeOrders(t *testing.T) (brokers.Backend, string, <-chan *message.Message) {
	t.Helper()
	prefix := testservers.NATSPrefix(t)
	b := openBackend(t, brokers.Config{Kind: brokers.NATS,
		NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}})
	sub, err := b.Subscriber("g", "c", brokers.SubscriberOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, b.Topics("orders")[0])
	if err != nil {
		t.Fatal(err)
	}
	return b, prefix, msgs
}

// receive takes and acks msgs until every id in ids came, or fails after 30s.
func receive(t *testing.T, msgs <-chan *message.Message, ids []string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	deadline := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case m := <-msgs:
			delete(want, m.UUID)
			m.Ack()
		case <-deadline:
			t.Fatalf("%d of %d messages never delivered", len(want), len(ids))
		}
	}
}

// A replay sends again what was sent before, perhaps within JetStream's
// duplicate window: on a replay topic the same message id published twice
// is delivered twice (elsewhere the second is dropped as a duplicate).
func TestReplayTopicsAreNotDeduplicated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		topic string
		want  int
	}{{brokers.ReplayTopicPrefix + "projector", 2}, {"orders", 1}} {
		t.Run(tc.topic, func(t *testing.T) {
			t.Parallel()
			prefix := testservers.NATSPrefix(t)
			b := openBackend(t, brokers.Config{Kind: brokers.NATS,
				NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}})
			m := message.NewMessage(watermill.NewUUID(), []byte("x"))
			for range 2 {
				for _, err := range b.Broker().Publish(context.Background(), []forwarder.Outgoing{{Topic: tc.topic, AggregateID: "a", Message: m}}) {
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			info, err := jetStream(t).StreamInfo(strings.ReplaceAll(prefix+tc.topic, ".", "_"))
			if err != nil {
				t.Fatal(err)
			}
			if got := int(info.State.Msgs); got != tc.want {
				t.Fatalf("the stream holds %d messages, want %d", got, tc.want)
			}
		})
	}
}

// A durable consumer that answers nothing, as nats-server before 2.9.15
// makes one created while its stream is being created (the subscriber's
// retries racing the stream's re-creation after a loss), is created again:
// its info looks sound, so only its silence tells.
func TestSubscriberRecreatesAConsumerThatAnswersNothing(t *testing.T) {
	t.Parallel()
	srv := testservers.StartNATS(t)
	const group = "g"
	subject, id := muteConsumer(t, srv.URL, group)
	sub, err := outflownats.NewSubscriber(outflownats.SubscriberConfig{JetStream: jetStreamAt(t, srv.URL), Group: group,
		Stream: func(string) string { return subject }, CheckInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), subject)
	if err != nil {
		t.Fatal(err)
	}
	receive(t, msgs, []string{id})
}

// muteConsumer creates streams on the server at url, each while the
// durable consumer of group on it is being created as the subscriber
// creates it, until one such consumer answers no fetch, not even with a
// heartbeat. It returns the subject (and stream) of that consumer, and the
// id of the message the stream holds, which the consumer never delivered.
// When none was mute, as on a server that makes a stream visible only once
// it can send, it returns the last one.
func muteConsumer(t *testing.T, url, group string) (subject, id string) {
	t.Helper()
	js := jetStreamAt(t, url)
	// Connections of their own: the server handles one connection's
	// requests one after the other, a consumer's creation never during
	// its stream's.
	creators := make([]nats.JetStreamContext, 3)
	for i := range creators {
		creators[i] = jetStreamAt(t, url)
	}
	const tries = 1000
	for i := range tries {
		name := fmt.Sprintf("mute%d", i)
		cfg := &nats.ConsumerConfig{Durable: group + "_" + name, FilterSubject: name, AckPolicy: nats.AckExplicitPolicy,
			DeliverPolicy: nats.DeliverAllPolicy, AckWait: brokers.DefaultClaimIdle, MaxAckPending: 1000} // the subscriber's defaults
		var (
			created    atomic.Bool
			wg, trying sync.WaitGroup
		)
		for _, c := range creators {
			trying.Add(1)
			wg.Go(func() {
				first := true
				for !created.Load() {
					if _, err := c.AddConsumer(name, cfg); err == nil {
						created.Store(true)
					}
					if first {
						first = false
						trying.Done()
					}
				}
			})
		}
		trying.Wait() // every creator is at it when the stream comes
		if _, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		var marshaler wmnats.NATSMarshaler
		nm, err := marshaler.Marshal(name, m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(nm); err != nil {
			t.Fatal(err)
		}
		subject, id = name, m.UUID
		if mute(t, js, name, cfg.Durable) {
			t.Logf("consumer %s answers nothing, after %d tries", cfg.Durable, i+1)
			return subject, id
		}
	}
	// Not a skip: the subscriber must still deliver what the last,
	// sound, consumer holds.
	t.Logf("no consumer created while its stream was answered nothing in %d tries: this nats-server makes a stream visible only once it can send", tries)
	return subject, id
}

// mute reports whether durable on stream, which holds a message, answers
// a fetch with nothing, not even a heartbeat.
func mute(t *testing.T, js nats.JetStreamContext, stream, durable string) bool {
	t.Helper()
	sub, err := js.PullSubscribe(stream, durable, nats.Bind(stream, durable))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	msgs, err := sub.Fetch(1, nats.MaxWait(time.Second), nats.PullHeartbeat(200*time.Millisecond))
	if len(msgs) == 0 && !errors.Is(err, nats.ErrNoHeartbeat) {
		t.Fatalf("a fetch of a message on %s: %v", durable, err)
	}
	for _, m := range msgs {
		_ = m.Nak() // for the subscriber, at once
	}
	return len(msgs) == 0
}
