package nats_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// On a three-node cluster, streams get the configured three replicas; the
// stream's leader killed, publishes go on (after the election), the group
// receives everything, and the audit takes the leader change for no loss.
func TestThreeReplicasOnACluster(t *testing.T) {
	t.Parallel()
	c := outflowtest.StartNATSCluster(t)
	b := openBackend(t, brokers.Config{Kind: brokers.NATS, Partitions: 2,
		NATS: brokers.NATSConfig{URL: c.URL, Replicas: 3, PublishTimeout: 2 * time.Second}})
	ids := publishEventually(t, b, "orders", 10)

	conn, err := nats.Connect(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	js, err := conn.JetStream(nats.MaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.StreamInfo("orders")
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream of %d replicas, cluster %+v; want 3", info.Config.Replicas, info.Cluster)
	}

	a := b.Broker().(forwarder.Auditor)
	states := map[string][]byte{}
	for _, s := range b.Topics("orders") {
		next, loss, err := a.Audit(context.Background(), s, nil)
		if err != nil || loss != nil {
			t.Fatalf("baseline of %s: %v, %v", s, loss, err)
		}
		states[s] = next
	}

	sub, err := b.Subscriber("g", "c", brokers.SubscriberOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	got := map[string]bool{}
	var gotMu sync.Mutex
	for _, s := range b.Topics("orders") {
		msgs, err := sub.Subscribe(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range msgs {
				m.Ack()
				gotMu.Lock()
				got[m.UUID] = true
				gotMu.Unlock()
			}
		}()
	}

	leader := c.Node(info.Cluster.Leader)
	if leader < 0 {
		t.Fatalf("leader %q is no node of the cluster", info.Cluster.Leader)
	}
	c.Kill(leader)
	ids = append(ids, publishEventually(t, b, "orders", 10)...)
	outflowtest.WaitFor(t, 60*time.Second, "every message received", func() bool {
		gotMu.Lock()
		defer gotMu.Unlock()
		for _, id := range ids {
			if !got[id] {
				return false
			}
		}
		return true
	})
	outflowtest.WaitFor(t, 30*time.Second, "the audit to answer after the election", func() bool {
		for s, prev := range states {
			next, loss, err := a.Audit(context.Background(), s, prev)
			if err != nil {
				return false
			}
			if loss != nil {
				t.Fatalf("%s: a leader change taken for a loss: %+v", s, *loss)
			}
			states[s] = next
		}
		return true
	})
	c.Restart(leader)
}
