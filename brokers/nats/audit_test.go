package nats_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// auditor audits one subject, keeping the state between calls.
type auditor struct {
	t       *testing.T
	a       forwarder.Auditor
	subject string
	state   []byte
}

func (a *auditor) audit() *forwarder.Loss {
	a.t.Helper()
	next, loss, err := a.a.Audit(context.Background(), a.subject, a.state)
	if err != nil {
		a.t.Fatal(err)
	}
	if len(next) == 0 {
		a.t.Fatal("no state returned")
	}
	a.state = next
	return loss
}

func (a *auditor) requireNoLoss(what string) {
	a.t.Helper()
	if loss := a.audit(); loss != nil {
		a.t.Fatalf("%s: reported a loss: %+v", what, *loss)
	}
}

func openAudited(t *testing.T, partitions int) (brokers.Backend, forwarder.Auditor, string) {
	t.Helper()
	prefix := outflowtest.NATSPrefix(t)
	b := openBackend(t, brokers.Config{Kind: brokers.NATS, Partitions: partitions,
		NATS: brokers.NATSConfig{URL: outflowtest.NATSURL(), StreamPrefix: prefix}})
	a, ok := b.Broker().(forwarder.Auditor)
	if !ok {
		t.Fatal("the NATS broker is no forwarder.Auditor")
	}
	return b, a, prefix
}

// msgTime is the stored time of stream's message seq.
func msgTime(t *testing.T, js nats.JetStreamContext, stream string, seq uint64) time.Time {
	t.Helper()
	m, err := js.GetMsg(stream, seq)
	if err != nil {
		t.Fatal(err)
	}
	return m.Time
}

// ackFirst has a durable consumer of subject fetch n messages and
// acknowledge them.
func ackFirst(t *testing.T, js nats.JetStreamContext, stream, subject, durable string, n int) {
	t.Helper()
	if _, err := js.AddConsumer(stream, &nats.ConsumerConfig{Durable: durable, FilterSubject: subject,
		AckPolicy: nats.AckExplicitPolicy, DeliverPolicy: nats.DeliverAllPolicy}); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return
	}
	sub, err := js.PullSubscribe(subject, durable, nats.Bind(stream, durable))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	msgs, err := sub.Fetch(n, nats.MaxWait(10*time.Second))
	if err != nil || len(msgs) != n {
		t.Fatalf("fetched %d of %d: %v", len(msgs), n, err)
	}
	for _, m := range msgs {
		if err := m.AckSync(); err != nil {
			t.Fatal(err)
		}
	}
}

// Baselines, growth, and a purge (what limits do to old messages) are no
// loss.
func TestAuditSeesNoLossWhereThereIsNone(t *testing.T) {
	t.Parallel()
	b, a, prefix := openAudited(t, 1)
	au := &auditor{t: t, a: a, subject: b.Topics("orders")[0]}
	au.requireNoLoss("baseline of a stream not created yet")
	publish(t, b, "orders", 5)
	au.requireNoLoss("the stream created and written since the baseline")
	publish(t, b, "orders", 5)
	au.requireNoLoss("grown")
	ackFirst(t, jetStream(t), prefix+"orders", au.subject, "g", 10)
	if err := jetStream(t).PurgeStream(prefix + "orders"); err != nil {
		t.Fatal(err)
	}
	au.requireNoLoss("purged after every message was acknowledged")
	publish(t, b, "orders", 1)
	au.requireNoLoss("written after the purge")

	au.state = []byte("not json")
	au.requireNoLoss("an unreadable state is a new baseline")
}

// A stream deleted and created again is a loss from the first message no
// consumer had acknowledged: with no consumer, the stream's first message.
func TestAuditSeesARecreatedStream(t *testing.T) {
	t.Parallel()
	b, a, prefix := openAudited(t, 1)
	js := jetStream(t)
	au := &auditor{t: t, a: a, subject: b.Topics("orders")[0]}
	publish(t, b, "orders", 5)
	first := msgTime(t, js, prefix+"orders", 1)
	au.requireNoLoss("baseline")
	if err := js.DeleteStream(prefix + "orders"); err != nil {
		t.Fatal(err)
	}
	publishEventually(t, b, "orders", 7) // more than before: the sequence alone would not show it
	loss := au.audit()
	if loss == nil || !strings.Contains(loss.Reason, "stream recreated") || !loss.Since.Equal(first) {
		t.Fatalf("got %+v, want a recreated stream since the first message, %s", loss, first)
	}
	au.requireNoLoss("the new stream is the new baseline")
}

// A stream deleted is a loss from the first message some consumer had not
// acknowledged; what every consumer had handled is not sent again. On two
// partitions, each subject has its own floor.
func TestAuditLossStartsAtTheAckFloor(t *testing.T) {
	t.Parallel()
	b, a, prefix := openAudited(t, 2)
	js := jetStream(t)
	stream := prefix + "orders"
	publish(t, b, "orders", 20)
	subjects := b.Topics("orders")
	acked, unread := subjects[0], subjects[1]
	ackFirst(t, js, stream, acked, "g_0", 3)
	ackFirst(t, js, stream, acked, "h_0", 5) // another group, further on
	ackFirst(t, js, stream, unread, "g_1", 0)

	// The expected Since of each subject: its 4th message (after g_0's ack
	// floor), and its first (g_1 acked nothing).
	want := map[string]time.Time{}
	var seen = map[string]int{}
	for seq := uint64(1); seq <= 20; seq++ {
		m, err := js.GetMsg(stream, seq)
		if err != nil {
			t.Fatal(err)
		}
		seen[m.Subject]++
		if (m.Subject == acked && seen[m.Subject] == 4) || (m.Subject == unread && seen[m.Subject] == 1) {
			want[m.Subject] = m.Time
		}
	}
	if len(want) != 2 {
		t.Fatalf("the 20 messages did not spread over both subjects enough: %v", seen)
	}
	auditors := map[string]*auditor{}
	for _, s := range subjects {
		auditors[s] = &auditor{t: t, a: a, subject: s}
		auditors[s].requireNoLoss("baseline")
	}
	if err := js.DeleteStream(stream); err != nil {
		t.Fatal(err)
	}
	for _, s := range subjects {
		loss := auditors[s].audit()
		if loss == nil || !strings.Contains(loss.Reason, "stream missing") || !loss.Since.Equal(want[s]) {
			t.Fatalf("%s: got %+v, want a missing stream since %s", s, loss, want[s])
		}
	}
}

// When every consumer acknowledged everything, a loss can only have taken
// what came after: Since is the last message's time, not the first's.
func TestAuditAfterEverythingAcknowledged(t *testing.T) {
	t.Parallel()
	b, a, prefix := openAudited(t, 1)
	js := jetStream(t)
	stream := prefix + "orders"
	au := &auditor{t: t, a: a, subject: b.Topics("orders")[0]}
	publish(t, b, "orders", 4)
	ackFirst(t, js, stream, au.subject, "g", 4)
	last := msgTime(t, js, stream, 4)
	au.requireNoLoss("baseline")
	if err := js.DeleteStream(stream); err != nil {
		t.Fatal(err)
	}
	loss := au.audit()
	if loss == nil || !loss.Since.Equal(last) {
		t.Fatalf("got %+v, want a loss since the last message, %s", loss, last)
	}
}
