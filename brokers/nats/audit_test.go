package nats_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// The Auditor contract, on a nats-server of the test's own, two
// partitions (two subjects of one stream). A loss is the server stopped,
// its store wiped, and the stream created again empty (as a crash that
// takes the disk, then the provisioning, leave it). A failover is a store
// restored from a copy taken when HoldBack was called: the stream, and its
// consumers, as a replica that lacked what came after would have them;
// JetStream then gives the lost sequences to new messages.
func TestAuditContract(t *testing.T) {
	t.Parallel()
	brokertest.RunAudit(t, brokertest.AuditHarness{
		Parallel: true, // each subtest on a server of its own
		Open: func(t *testing.T) brokertest.AuditTarget {
			srv := testservers.StartNATS(t)
			b := openBackend(t, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2, NATS: brokers.NATSConfig{URL: srv.URL}})
			js := jetStreamAt(t, srv.URL)
			// restart stops the server, runs between on its stopped store,
			// starts it and waits until the backend is connected again.
			restart := func(t *testing.T, between func()) {
				srv.Stop()
				between()
				srv.Start()
				waitPing(t, b)
			}
			return brokertest.AuditTarget{
				Backend: b,
				Lose: func(t *testing.T, topic string) {
					restart(t, func() { emptyDir(t, srv.StoreDir()) })
					if _, err := js.AddStream(&nats.StreamConfig{Name: topic, Subjects: []string{topic, topic + ".*"},
						Storage: nats.FileStorage, Retention: nats.LimitsPolicy}); err != nil {
						t.Fatal(err)
					}
				},
				HoldBack: func(t *testing.T, topic string) func() {
					snapshot := t.TempDir()
					restart(t, func() { copyDir(t, srv.StoreDir(), snapshot) })
					return func() {
						restart(t, func() {
							emptyDir(t, srv.StoreDir())
							copyDir(t, snapshot, srv.StoreDir())
						})
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

// jetStreamAt connects to url for the test's own requests; it reconnects
// after the server restarts.
func jetStreamAt(t *testing.T, url string) nats.JetStreamContext {
	t.Helper()
	conn, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	js, err := conn.JetStream(nats.MaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// waitPing waits until b's connection answers JetStream again.
func waitPing(t *testing.T, b brokers.Backend) {
	t.Helper()
	outflowtest.WaitFor(t, 30*time.Second, "the backend to reach the restarted server", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return b.(brokers.Pinger).Ping(ctx) == nil
	})
}

// emptyDir removes what dir holds, keeping dir.
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// copyDir copies the tree under from into to.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}

// checked is a subject under audit on the shared server (streams of a
// prefix of the test's own), one partition: the subject and the stream
// share the topic's name. Check is called as the forwarder calls it, with
// the state the previous one returned and the receipts still unsettled.
type checked struct {
	t       *testing.T
	b       brokers.Backend
	a       forwarder.Auditor
	js      nats.JetStreamContext
	stream  string
	subject string
	state   []byte
	held    []forwarder.Held
}

func newChecked(t *testing.T, cfg *nats.StreamConfig) *checked {
	t.Helper()
	prefix := testservers.NATSPrefix(t)
	b := openBackend(t, brokers.Config{Kind: brokers.NATS,
		NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: prefix}})
	c := &checked{t: t, b: b, a: b.Broker().(forwarder.Auditor), js: jetStream(t), stream: prefix + "orders", subject: b.Topics("orders")[0]}
	// Created before the backend's first publish, which leaves a stream
	// of another configuration (cfg's limits) as it is.
	if cfg == nil {
		cfg = &nats.StreamConfig{}
	}
	cfg.Name, cfg.Subjects, cfg.Storage = c.stream, []string{c.stream, c.stream + ".*"}, nats.FileStorage
	if _, err := c.js.AddStream(cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// publish publishes n messages and holds their receipts.
func (c *checked) publish(n int) []forwarder.Held {
	c.t.Helper()
	msgs := make([]forwarder.Outgoing, n)
	for i := range msgs {
		m := message.NewMessage(watermill.NewUUID(), []byte("{}"))
		msgs[i] = forwarder.Outgoing{Topic: "orders", AggregateID: m.UUID, Message: m}
	}
	receipts, errs := c.a.PublishReceipts(context.Background(), msgs)
	out := make([]forwarder.Held, n)
	for i := range msgs {
		if errs[i] != nil {
			c.t.Fatal(errs[i])
		}
		if receipts[i].BrokerTopic != c.subject {
			c.t.Fatalf("receipt on %q, want %q", receipts[i].BrokerTopic, c.subject)
		}
		out[i] = forwarder.Held{Position: receipts[i].Position, MessageID: msgs[i].Message.UUID}
	}
	c.held = append(c.held, out...)
	return out
}

// check checks every held message, keeps the state and the unsettled
// ones, and returns the verdict.
func (c *checked) check() forwarder.Verdict {
	c.t.Helper()
	v, err := c.a.Check(context.Background(), c.subject, c.state, c.held, false)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(v.Status) != len(c.held) {
		c.t.Fatalf("%d statuses for %d messages", len(v.Status), len(c.held))
	}
	c.state = v.State
	var keep []forwarder.Held
	for i, s := range v.Status {
		if s == forwarder.Unsettled {
			keep = append(keep, c.held[i])
		}
	}
	c.held = keep
	return v
}

// consumer creates durable consumer name of the subject, as the
// subscriber does (explicit acks, from the stream's start).
func (c *checked) consumer(name string) {
	c.t.Helper()
	if _, err := c.js.AddConsumer(c.stream, &nats.ConsumerConfig{Durable: name, FilterSubject: c.subject,
		AckPolicy: nats.AckExplicitPolicy, DeliverPolicy: nats.DeliverAllPolicy}); err != nil {
		c.t.Fatal(err)
	}
}

// readAck has consumer name fetch n messages and acknowledge them (the
// server confirms each ack).
func (c *checked) readAck(name string, n int) {
	c.t.Helper()
	sub, err := c.js.PullSubscribe(c.subject, name, nats.Bind(c.stream, name))
	if err != nil {
		c.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	got := 0
	outflowtest.WaitFor(c.t, 10*time.Second, strconv.Itoa(n)+" messages fetched and acknowledged", func() bool {
		msgs, err := sub.Fetch(n-got, nats.MaxWait(time.Second))
		if err != nil && !errors.Is(err, nats.ErrTimeout) {
			c.t.Fatal(err)
		}
		for _, m := range msgs {
			if err := m.AckSync(); err != nil {
				c.t.Fatal(err)
			}
		}
		got += len(msgs)
		return got >= n
	})
}

func count(status []forwarder.Status, s forwarder.Status) int {
	n := 0
	for _, x := range status {
		if x == s {
			n++
		}
	}
	return n
}

// A purge of messages every consumer had acknowledged is no loss; what is
// published after is found.
func TestCheckPurgeOfAcknowledgedIsNoLoss(t *testing.T) {
	t.Parallel()
	c := newChecked(t, nil)
	c.consumer("g")
	c.publish(3)
	if v := c.check(); count(v.Status, forwarder.Unsettled) != 3 {
		t.Fatalf("before any read: %v (%s)", v.Status, v.Reason)
	}
	c.publish(5)
	c.readAck("g", 8)
	if err := c.js.PurgeStream(c.stream); err != nil {
		t.Fatal(err)
	}
	if v := c.check(); count(v.Status, forwarder.Settled) != 8 {
		t.Fatalf("after the purge: %v (%s)", v.Status, v.Reason)
	}
	c.publish(2)
	if v := c.check(); count(v.Status, forwarder.Unsettled) != 2 {
		t.Fatalf("published after the purge: %v (%s)", v.Status, v.Reason)
	}
}

// MaxMsgs removing messages every consumer had acknowledged is no loss.
func TestCheckMaxMsgsOfAcknowledgedIsNoLoss(t *testing.T) {
	t.Parallel()
	c := newChecked(t, &nats.StreamConfig{MaxMsgs: 5})
	c.consumer("g")
	c.publish(3)
	c.check()
	c.readAck("g", 3)
	c.publish(5) // the stream keeps the last five: the first three go
	info, err := c.js.StreamInfo(c.stream)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq != 4 {
		t.Fatalf("the stream's first sequence is %d, want 4", info.State.FirstSeq)
	}
	v := c.check()
	if count(v.Status, forwarder.Settled) != 3 || count(v.Status, forwarder.Unsettled) != 5 {
		t.Fatalf("after MaxMsgs: %v (%s)", v.Status, v.Reason)
	}
}

// MaxAge expiring messages every consumer had acknowledged is no loss.
func TestCheckMaxAgeOfAcknowledgedIsNoLoss(t *testing.T) {
	t.Parallel()
	c := newChecked(t, &nats.StreamConfig{MaxAge: time.Second, Duplicates: time.Second})
	c.consumer("g")
	c.publish(4)
	c.check()
	c.readAck("g", 4)
	outflowtest.WaitFor(t, 10*time.Second, "the messages to expire", func() bool {
		info, err := c.js.StreamInfo(c.stream)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs == 0
	})
	if v := c.check(); count(v.Status, forwarder.Settled) != 4 {
		t.Fatalf("after MaxAge: %v (%s)", v.Status, v.Reason)
	}
}

// A purge of messages no consumer had read is a loss, though JetStream
// moves the consumers' ack floors past what it purged.
func TestCheckFindsAPurgeOfUnreadMessages(t *testing.T) {
	t.Parallel()
	c := newChecked(t, nil)
	c.consumer("g")
	c.publish(2)
	c.check()
	c.readAck("g", 2)
	c.publish(3)
	if err := c.js.PurgeStream(c.stream); err != nil {
		t.Fatal(err)
	}
	ci, err := c.js.ConsumerInfo(c.stream, "g")
	if err != nil {
		t.Fatal(err)
	}
	if ci.AckFloor.Stream != 5 {
		t.Fatalf("the purge left the ack floor at %d; this test expects JetStream to move it to 5", ci.AckFloor.Stream)
	}
	v := c.check()
	if count(v.Status, forwarder.Settled) != 2 || count(v.Status, forwarder.Lost) != 3 {
		t.Fatalf("after the purge: %v (%s)", v.Status, v.Reason)
	}
	if !strings.Contains(v.Reason, "deliveries") {
		t.Fatalf("reason %q", v.Reason)
	}
}

// MaxMsgs removing messages before the consumer read them, the consumer
// then reading on past them (which moves its ack floor over them): a loss.
func TestCheckFindsMessagesALimitRemovedUnread(t *testing.T) {
	t.Parallel()
	c := newChecked(t, &nats.StreamConfig{MaxMsgs: 3})
	c.consumer("g")
	c.publish(3)
	c.check()
	c.publish(3) // the first three go, unread
	c.readAck("g", 3)
	v := c.check()
	if count(v.Status, forwarder.Lost) != 3 || count(v.Status, forwarder.Settled) != 3 {
		t.Fatalf("after MaxMsgs: %v (%s)", v.Status, v.Reason)
	}
}

// A message deleted before its consumer acknowledged it is a loss; one
// deleted after is not.
func TestCheckFindsADeletionOfAnUnreadMessage(t *testing.T) {
	t.Parallel()
	c := newChecked(t, nil)
	c.consumer("g")
	held := c.publish(4)
	c.check()
	c.readAck("g", 2)
	for _, h := range []forwarder.Held{held[0], held[3]} {
		seq, _ := strconv.ParseUint(h.Position, 10, 64)
		if err := c.js.DeleteMsg(c.stream, seq); err != nil {
			t.Fatal(err)
		}
	}
	v := c.check()
	want := []forwarder.Status{forwarder.Settled, forwarder.Settled, forwarder.Unsettled, forwarder.Lost}
	for i := range want {
		if v.Status[i] != want[i] {
			t.Fatalf("got %v, want %v (%s)", v.Status, want, v.Reason)
		}
	}
	if !strings.Contains(v.Reason, "before consumer g acknowledged it") {
		t.Fatalf("reason %q", v.Reason)
	}
}
