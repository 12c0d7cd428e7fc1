package nats_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// On a three-node cluster, streams get the configured three replicas; the
// stream's leader killed, publishes go on (after the election), the group
// receives everything, and the audit takes the leader change for no loss.
func TestThreeReplicasOnACluster(t *testing.T) {
	t.Parallel()
	c := testservers.StartNATSCluster(t)
	b := openBackend(t, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2,
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

	a := &auditedTopic{t: t, a: b.Broker().(forwarder.Auditor), states: map[string][]byte{}, msgs: map[string][]forwarder.Held{}}
	ids = append(ids, a.publish(10)...)
	a.check() // before any consumer: unsettled, and the states of the stream

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
	ids = append(ids, a.publish(10)...)
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
	outflowtest.WaitFor(t, 30*time.Second, "every receipt settled after the election", func() bool {
		return a.check() == 0
	})
	c.Restart(t, leader)
}

// auditedTopic publishes with receipts and checks them as the forwarder does:
// each subject with the state of its previous Check, the receipts it has
// not settled yet.
type auditedTopic struct {
	t      *testing.T
	a      forwarder.Auditor
	states map[string][]byte
	msgs   map[string][]forwarder.Held // by subject
}

// publish publishes n messages of "orders", each its own aggregate,
// sending again what the broker cannot take yet, and returns their ids.
func (h *auditedTopic) publish(n int) []string {
	h.t.Helper()
	var left, all []forwarder.Outgoing
	for range n {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		left = append(left, forwarder.Outgoing{Topic: "orders", AggregateID: m.UUID, Message: m})
	}
	all = left
	outflowtest.WaitFor(h.t, 30*time.Second, "the broker to take every message", func() bool {
		var retry []forwarder.Outgoing
		receipts, errs := h.a.PublishReceipts(context.Background(), left)
		for i, err := range errs {
			switch {
			case errors.Is(err, forwarder.ErrBrokerUnavailable):
				retry = append(retry, left[i])
			case err != nil:
				h.t.Fatal(err)
			default:
				r := receipts[i]
				h.msgs[r.BrokerTopic] = append(h.msgs[r.BrokerTopic], forwarder.Held{Position: r.Position, MessageID: left[i].Message.UUID})
			}
		}
		left = retry
		return len(left) == 0
	})
	ids := make([]string, len(all))
	for i, m := range all {
		ids[i] = m.Message.UUID
	}
	return ids
}

// check checks every subject's unsettled receipts, fails the test on a
// loss, and returns how many receipts stay unsettled (-1 when a Check
// failed: a stream or consumer leader not elected yet).
func (h *auditedTopic) check() int {
	h.t.Helper()
	left := 0
	for subject, msgs := range h.msgs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := h.a.Check(ctx, subject, h.states[subject], msgs, false)
		cancel()
		if err != nil {
			h.t.Logf("check %s: %v", subject, err)
			return -1
		}
		h.states[subject] = v.State
		var keep []forwarder.Held
		for i, s := range v.Status {
			switch s {
			case forwarder.Lost:
				h.t.Fatalf("%s: sequence %s taken for lost: %s", subject, msgs[i].Position, v.Reason)
			case forwarder.Unsettled:
				keep = append(keep, msgs[i])
			}
		}
		h.msgs[subject] = keep
		left += len(keep)
	}
	return left
}

// The Auditor contract on a three-node cluster of the test's own (one for
// every subtest, each on a topic of its own), streams of three replicas,
// two partitions. A loss is the stream deleted and created again empty. A
// failover is the stream losing its tail: a follower that had every
// message so far is killed (HoldBack); the two others acknowledge what
// comes next, then lose their disks; the follower comes back first, and
// its log, without the tail, is the one the two empty nodes take when
// they join. JetStream then gives the lost sequences to new messages.
func TestAuditContractOnACluster(t *testing.T) {
	t.Parallel()
	var c *testservers.NATSCluster
	brokertest.RunAudit(t, brokertest.AuditHarness{
		Open: func(st *testing.T) brokertest.AuditTarget {
			if c == nil {
				c = testservers.StartNATSCluster(t)
			}
			// The default PublishTimeout (5 s) also bounds the creation of
			// a stream of three replicas, which on a loaded machine may
			// take more than the 2 s the tests above give a publish.
			b := openBackend(st, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2,
				NATS: brokers.NATSConfig{URL: c.URL, Replicas: 3}})
			js := jetStreamAt(st, c.URL)
			// ready waits until the stream has a leader and at least
			// replicas followers with every message, takes writes through
			// the nodes up, and the backend is connected: the contract
			// publishes at once, and fails on an error.
			ready := func(t *testing.T, topic string, replicas int, up ...int) {
				outflowtest.WaitFor(t, 60*time.Second, "the stream's leader and current replicas", func() bool {
					info, err := js.StreamInfo(topic)
					if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
						return false
					}
					current := 0
					for _, r := range info.Cluster.Replicas {
						if r.Current && !r.Offline && r.Lag == 0 {
							current++
						}
					}
					return current >= replicas
				})
				waitWritable(t, c, topic, up...)
				waitPing(t, b)
			}
			return brokertest.AuditTarget{
				Backend: b,
				Lose: func(t *testing.T, topic string) {
					if err := js.DeleteStream(topic); err != nil {
						t.Fatal(err)
					}
					// nats-server 2.9 removes a deleted stream's files after
					// it answered: a stream of the same name created before
					// would lose its files.
					outflowtest.WaitFor(t, 30*time.Second, "the deleted stream's files gone from every node", func() bool {
						for i := range 3 {
							if _, err := os.Stat(filepath.Join(c.StoreDir(i), "jetstream", "$G", "streams", topic)); err == nil {
								return false
							}
						}
						return true
					})
					if _, err := js.AddStream(&nats.StreamConfig{Name: topic, Subjects: []string{topic, topic + ".*"},
						Storage: nats.FileStorage, Retention: nats.LimitsPolicy, Replicas: 3}); err != nil {
						t.Fatal(err)
					}
					waitWritable(t, c, topic, 0, 1, 2)
				},
				HoldBack: func(t *testing.T, topic string) func() {
					behind, name := currentFollower(t, c, js, topic)
					c.Kill(behind)
					var up []int
					for i := range 3 {
						if i != behind {
							up = append(up, i)
						}
					}
					ready(t, topic, 1, up...)
					return func() {
						var others []int
						for i := range 3 {
							if i != behind {
								others = append(others, i)
								c.Kill(i)
							}
						}
						for _, i := range others {
							emptyDir(t, c.StoreDir(i))
						}
						// The node that lacks the tail first, with one empty
						// node: it is the only one of the two that can win an
						// election (its log is the longer), of the meta group,
						// the stream's and its consumers'. Two empty nodes
						// could elect one of them, and empty the stream: the
						// second joins only once the groups have leaders.
						c.Start(t, behind)
						c.Restart(t, others[0])
						// Each group elects its leader with random
						// timeouts, drawn again after a split vote: as
						// long as the restart's meta election, at worst.
						outflowtest.WaitFor(t, 2*time.Minute, "the stream and its consumers led from the node behind", func() bool {
							info, err := js.StreamInfo(topic)
							if err != nil || info.Cluster == nil || info.Cluster.Leader != name {
								return false
							}
							n := 0
							for ci := range js.ConsumersInfo(topic) {
								if ci.Cluster == nil || ci.Cluster.Leader == "" {
									return false
								}
								n++
							}
							return n == 2 // the group's durable of each partition
						})
						c.Restart(t, others[1])
						ready(t, topic, 2, 0, 1, 2)
					}
				},
				Trim: func(t *testing.T, topic string) {
					if err := js.PurgeStream(topic); err != nil {
						t.Fatal(err)
					}
				},
				Delete: func(t *testing.T, receipts []forwarder.Receipt) {
					for _, r := range receipts {
						stream, _, _ := strings.Cut(r.BrokerTopic, ".")
						seq, err := strconv.ParseUint(r.Position, 10, 64)
						if err != nil {
							t.Fatal(err)
						}
						if err := js.DeleteMsg(stream, seq); err != nil {
							t.Fatal(err)
						}
					}
				},
			}
		},
	})
}

// currentFollower waits until a follower of stream has every message its
// leader has, and returns its node and server name.
func currentFollower(t *testing.T, c *testservers.NATSCluster, js nats.JetStreamContext, stream string) (int, string) {
	t.Helper()
	node, name := -1, ""
	outflowtest.WaitFor(t, 30*time.Second, "a follower of the stream to be current", func() bool {
		info, err := js.StreamInfo(stream)
		if err != nil || info.Cluster == nil {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if r.Current && r.Lag == 0 && !r.Offline {
				node, name = c.Node(r.Name), r.Name
				return node >= 0
			}
		}
		return false
	})
	return node, name
}

// waitWritable waits until the stream of topic answers a publish through
// each of nodes: a stream just created, or just led again, takes its subjects
// on one node, and the others learn of it over their routes (until then a
// publish through them has no responders). The probe expects a last
// sequence no stream has, so the stream refuses it and stores nothing.
func waitWritable(t *testing.T, c *testservers.NATSCluster, topic string, nodes ...int) {
	t.Helper()
	for _, i := range nodes {
		js := jetStreamAt(t, c.NodeURL(i))
		outflowtest.WaitFor(t, 30*time.Second, "the stream to answer through node "+strconv.Itoa(i), func() bool {
			_, err := js.Publish(topic+".probe", nil, nats.ExpectLastSequence(math.MaxUint64), nats.AckWait(2*time.Second))
			var apiErr *nats.APIError
			return errors.As(err, &apiErr)
		})
	}
}
