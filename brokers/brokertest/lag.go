package brokertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// ObserveHarness opens a backend for [RunObserve].
type ObserveHarness struct {
	// Open returns a backend on names no other test uses; Group is
	// subscribed on a topic before anything is published to it. Required.
	Open func(t *testing.T) brokers.Backend
	// Outage returns a backend whose broker sw cuts off. Required.
	Outage func(t *testing.T) (brokers.Backend, testservers.Outage)
	// Aggregates is how many aggregates the published events spread over
	// (so over partitions). Defaults to 3; the sql backend, whose position
	// is the longest acked prefix in table order, is exact with 1.
	Aggregates int
	// NoOldestAge is set for a broker that cannot tell the oldest age
	// (RabbitMQ): Lag must then report it as zero.
	NoOldestAge bool
	// CountsUnacked is set for a broker whose lag counts what was
	// delivered and not acked yet (NATS, Redis, Kafka): the lag is then
	// checked while the subscriber runs too, and the k-th ack cannot race
	// the subscriber's close. Otherwise (sql, RabbitMQ) the suite takes
	// one more message after the k acked ones, and leaves it unacked,
	// before it closes the subscriber: a subscriber that hands an
	// aggregate's messages one at a time has then settled the k acks.
	CountsUnacked bool
}

// RunObserve runs the observability contract of a backend that implements
// [brokers.LagReporter] and [brokers.Pinger]:
//
//   - Lag: with n events published and k of them received and acked by
//     Group (its subscriber then closed), Lag reports n-k events and an
//     oldest age above zero; once the rest is acked, 0 and 0.
//   - Ping: nil while the broker answers, an error within the context's
//     deadline while it is cut off, nil again once it is back.
func RunObserve(t *testing.T, h ObserveHarness) {
	t.Helper()
	if h.Open == nil || h.Outage == nil {
		t.Fatal("brokertest: ObserveHarness.Open and ObserveHarness.Outage are required")
	}
	if h.Aggregates <= 0 {
		h.Aggregates = 3
	}
	t.Run("Lag", func(t *testing.T) { lagContract(t, h) })
	t.Run("Ping", func(t *testing.T) { pingContract(t, h) })
}

func lagContract(t *testing.T, h ObserveHarness) {
	b := h.Open(t)
	lr, ok := b.(brokers.LagReporter)
	if !ok {
		t.Fatalf("brokertest: the %s backend is not a brokers.LagReporter", b.Kind())
	}
	topic := uniqueTopic()
	lag := func() brokers.Lag {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := lr.Lag(ctx, Group, topic)
		if err != nil {
			t.Fatalf("Lag: %v", err)
		}
		return l
	}
	const n, k = 12, 5
	msgs, stop := subscribeBackend(t, b, topic)
	var batch []forwarder.Outgoing
	for v := range n / h.Aggregates {
		for a := range h.Aggregates {
			batch = append(batch, outgoing(topic, fmt.Sprint("agg-", a), int64(v+1), 0))
		}
	}
	for i, err := range publishWithin(t, b.Broker(), batch, 30*time.Second) {
		if err != nil {
			t.Fatalf("publish message %d: %v", i, err)
		}
	}
	receive(t, msgs, k, 30*time.Second)
	want := func(when string) {
		t.Helper()
		waitLag(t, lag, fmt.Sprintf("%d events, older than 0, %s", n-k, when), func(l brokers.Lag) bool {
			return l.Events == n-k && (l.OldestAge > 0 || h.NoOldestAge)
		})
		if l := lag(); h.NoOldestAge && l.OldestAge != 0 {
			t.Fatalf("Lag reports an oldest age, %s, the broker cannot tell", l.OldestAge)
		}
	}
	if h.CountsUnacked {
		want("while subscribed")
	} else {
		select {
		case <-msgs: // not acked
		case <-time.After(30 * time.Second):
			t.Fatalf("message %d did not arrive", k+1)
		}
	}
	stop() // what was delivered and not acked goes back to the group
	want("once the subscriber closed")

	msgs, stop = subscribeBackend(t, b, topic)
	defer stop()
	receiveDistinct(t, msgs, n-k, 30*time.Second)
	waitLag(t, lag, "0 events, age 0, once drained", func(l brokers.Lag) bool { return l == brokers.Lag{} })
}

// waitLag polls lag until ok, and fails naming the last lag seen.
func waitLag(t *testing.T, lag func() brokers.Lag, what string, ok func(brokers.Lag) bool) {
	t.Helper()
	var last brokers.Lag
	defer func() {
		if t.Failed() {
			t.Logf("last lag seen: %+v", last)
		}
	}()
	outflowtest.WaitFor(t, 30*time.Second, "Lag to report "+what, func() bool {
		last = lag()
		return ok(last)
	})
}

func pingContract(t *testing.T, h ObserveHarness) {
	b, sw := h.Outage(t)
	p, ok := b.(brokers.Pinger)
	if !ok {
		t.Fatalf("brokertest: the %s backend is not a brokers.Pinger", b.Kind())
	}
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		err := p.Ping(ctx)
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("Ping took %s: it must honour the context", d)
		}
		return err
	}
	if err := ping(); err != nil {
		t.Fatalf("Ping with the broker up: %v", err)
	}
	sw.Stop()
	// A client may learn of the cut only at its next round trip.
	outflowtest.WaitFor(t, 30*time.Second, "Ping to fail with the broker down", func() bool { return ping() != nil })
	sw.Start()
	var last error
	outflowtest.WaitFor(t, 60*time.Second, "Ping to succeed once the broker is back", func() bool {
		last = ping()
		return last == nil
	})
}

// subscribeBackend subscribes [Group] to every broker topic of topic; stop
// closes the subscriber (idempotent; also run at the test's end).
func subscribeBackend(t *testing.T, b brokers.Backend, topic string) (<-chan *message.Message, func()) {
	t.Helper()
	return subscribeAs(t, b, Group, topic)
}

// subscribeAs is subscribeBackend for any group.
func subscribeAs(t *testing.T, b brokers.Backend, group, topic string) (<-chan *message.Message, func()) {
	t.Helper()
	sub, err := b.Subscriber(group, "c"+watermill.NewShortUUID(), brokers.SubscriberOptions{ClaimIdle: 5 * time.Second})
	if err != nil {
		t.Fatalf("brokertest: subscriber: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *message.Message)
	var wg sync.WaitGroup
	for _, bt := range b.Topics(topic) {
		ch, err := sub.Subscribe(ctx, bt)
		if err != nil {
			cancel()
			t.Fatalf("brokertest: subscribe to %s: %v", bt, err)
		}
		wg.Go(func() {
			for m := range ch {
				select {
				case out <- m:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := sub.Close(); err != nil && !errors.Is(err, context.Canceled) {
				t.Logf("brokertest: close the subscriber: %v", err)
			}
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return out, stop
}
