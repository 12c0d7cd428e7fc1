package brokertest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// AuditHarness opens an auditing backend for [RunAudit].
type AuditHarness struct {
	// Open returns a target on a broker the test may damage (a server of
	// its own), on names no other test uses. Required.
	Open func(t *testing.T) AuditTarget
	// Parallel runs the subtests in parallel: each target Open returns is
	// independent of the others (a server of its own, which Lose and
	// HoldBack damage without touching another subtest's). Most of a
	// subtest is waiting for a server to restart or a consumer to
	// catch up.
	Parallel bool
}

// AuditTarget is one auditing backend under test and the ways to damage it.
type AuditTarget struct {
	// Backend's Broker must be a [forwarder.Auditor]. Required.
	Backend brokers.Backend
	// Lose makes the broker lose every message it holds on the broker
	// topics of topic, as a crash that takes its data does (a flush, a
	// restart without persistence, a store or topic deleted), consumer
	// groups included, and then take writes again. Required.
	Lose func(t *testing.T, topic string)
	// HoldBack starts a failover that will lose what is published to
	// topic from now on: the broker acknowledges those messages, then
	// failOver makes it lose them (a replica that lacked them takes over)
	// and take writes again, consumer groups kept as the replica had them.
	// Nil for a broker where this cannot be staged: the subtest then
	// checks nothing (say why in your test).
	HoldBack func(t *testing.T, topic string) (failOver func())
	// Trim removes from the broker topics of topic what every consumer
	// group acknowledged, as the broker's own retention does (a stream's
	// limits, Kafka's retention or DeleteRecords). Nil for a broker whose
	// auditor does the trimming (Redis: Check trims what it settled;
	// another hand's trim of what it has not settled yet cannot be told
	// from a failover, and is taken for a loss).
	Trim func(t *testing.T, topic string)
	// Delete deletes the messages at the receipts given, one by one, as an
	// operator or a consumer may (XDEL, XACKDEL, a JetStream message
	// delete). Nil for a broker that cannot delete one message (Kafka):
	// the subtest then checks nothing.
	Delete func(t *testing.T, receipts []forwarder.Receipt)
}

// RunAudit runs the broker-loss contract of a [forwarder.Auditor]: the
// receipts PublishReceipts returns and Check's judgement of them. Check is
// called as the forwarder calls it, each broker topic with the state its
// previous Check returned.
//
//   - Receipts: one receipt per acknowledged message, on one of the
//     backend's broker topics of the message's topic, positions distinct.
//   - UnreadIsUnsettled: what no consumer group read yet is Unsettled,
//     never Settled nor Lost.
//   - AcknowledgedIsSettled: what [Group] received and acknowledged is
//     Settled (within a few audits: acknowledgements may travel
//     asynchronously).
//   - LossBeforeAnyAudit: messages lost before any Check ran, with new
//     ones published after the loss, are Lost; the new ones are not.
//   - LossAfterAnAudit: the same, after a Check of the lost ones.
//   - FailoverUnderTraffic (with HoldBack): messages lost by a failover,
//     while a consumer group reads on and new messages are published after
//     it, are Lost; those before and after are not.
//   - TrimIsNoLoss: messages every group acknowledged and the broker then
//     trimmed (Trim, or Check's own trim), before any Check settled them,
//     are not Lost; nor are messages published before the trim whose
//     receipts reach Check only after it (a batch whose mark commits late).
//   - DeleteOfAcknowledgedIsNoLoss (with Delete): messages every group
//     acknowledged, then deleted one by one, are not Lost.
//   - NewGroupIsNoLoss: a consumer group created after a trim, at the
//     stream's start, makes nothing Lost.
//   - GroupLostWithTheDataIsAwaited: of two groups lost with the broker's
//     data, one comes back and reads the new messages, the other not yet:
//     the new messages are not Settled until the second is back and has
//     them (settled, a broker that trims could drop them before it reads).
func RunAudit(t *testing.T, h AuditHarness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("brokertest: AuditHarness.Open is required")
	}
	for _, c := range []struct {
		name string
		run  func(t *testing.T, target AuditTarget)
	}{
		{"Receipts", receiptsContract},
		{"UnreadIsUnsettled", unreadContract},
		{"AcknowledgedIsSettled", acknowledgedContract},
		{"LossBeforeAnyAudit", func(t *testing.T, target AuditTarget) { lossContract(t, target, false) }},
		{"LossAfterAnAudit", func(t *testing.T, target AuditTarget) { lossContract(t, target, true) }},
		{"FailoverUnderTraffic", failoverContract},
		{"TrimIsNoLoss", trimContract},
		{"DeleteOfAcknowledgedIsNoLoss", deleteContract},
		{"NewGroupIsNoLoss", newGroupContract},
		{"GroupLostWithTheDataIsAwaited", lostGroupContract},
	} {
		t.Run(c.name, func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			c.run(t, h.Open(t))
		})
	}
}

// audited is a topic under audit: what was published to it, and each
// broker topic's state as the forwarder would keep it.
type audited struct {
	t       *testing.T
	target  AuditTarget
	auditor forwarder.Auditor
	topic   string
	states  map[string][]byte
	next    int // the next aggregate's number
}

func newAudited(t *testing.T, target AuditTarget) *audited {
	t.Helper()
	if target.Backend == nil || target.Lose == nil {
		t.Fatal("brokertest: AuditTarget.Backend and Lose are required")
	}
	a, ok := target.Backend.Broker().(forwarder.Auditor)
	if !ok {
		t.Fatalf("brokertest: the %s backend's Broker is not a forwarder.Auditor", target.Backend.Kind())
	}
	return &audited{t: t, target: target, auditor: a, topic: uniqueTopic(), states: map[string][]byte{}}
}

// sent is one message published, with its receipt.
type sent struct {
	receipt   forwarder.Receipt
	messageID string
}

// publish publishes n messages of fresh aggregates (spread over the
// backend's partitions), each acknowledged, and returns their receipts.
func (a *audited) publish(n int) []sent {
	a.t.Helper()
	msgs := make([]forwarder.Outgoing, n)
	for i := range msgs {
		msgs[i] = outgoing(a.topic, fmt.Sprint("agg-", a.next), 1, 0)
		a.next++
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	receipts, errs := a.auditor.PublishReceipts(ctx, msgs)
	if len(receipts) != n || len(errs) != n {
		a.t.Fatalf("PublishReceipts returned %d receipts and %d errors for %d messages", len(receipts), len(errs), n)
	}
	out := make([]sent, n)
	for i, err := range errs {
		if err != nil {
			a.t.Fatalf("publish message %d: %v", i, err)
		}
		if receipts[i].BrokerTopic == "" || receipts[i].Position == "" {
			a.t.Fatalf("message %d: acknowledged with an empty receipt %+v", i, receipts[i])
		}
		out[i] = sent{receipts[i], msgs[i].Message.UUID}
	}
	return out
}

// check runs Check on every broker topic of msgs, as the forwarder does,
// keeping the states, and returns each message's status in msgs' order.
func (a *audited) check(msgs []sent) []forwarder.Status {
	a.t.Helper()
	byTopic := map[string][]int{}
	var topics []string
	for i, m := range msgs {
		bt := m.receipt.BrokerTopic
		if _, ok := byTopic[bt]; !ok {
			topics = append(topics, bt)
		}
		byTopic[bt] = append(byTopic[bt], i)
	}
	slices.Sort(topics)
	out := make([]forwarder.Status, len(msgs))
	for _, bt := range topics {
		idx := byTopic[bt]
		held := make([]forwarder.Held, len(idx))
		for k, i := range idx {
			held[k] = forwarder.Held{Position: msgs[i].receipt.Position, MessageID: msgs[i].messageID}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		v, err := a.auditor.Check(ctx, bt, a.states[bt], held, false)
		cancel()
		if err != nil {
			a.t.Fatalf("Check %s: %v", bt, err)
		}
		if len(v.Status) != len(held) {
			a.t.Fatalf("Check %s returned %d statuses for %d messages", bt, len(v.Status), len(held))
		}
		if slices.Contains(v.Status, forwarder.Lost) && v.Reason == "" {
			a.t.Fatalf("Check %s found a loss and gave no reason", bt)
		}
		a.states[bt] = v.State
		for k, i := range idx {
			out[i] = v.Status[k]
		}
	}
	return out
}

// settle checks msgs until every one is Settled (acknowledgements may
// travel asynchronously), failing if one is ever Lost.
func (a *audited) settle(msgs []sent, what string) {
	a.t.Helper()
	held := msgs
	outflowtest.WaitFor(a.t, 30*time.Second, what, func() bool {
		status := a.check(held)
		requireStatus(a.t, what, status, notLost)
		held = unsettledOnly(held, status)
		return len(held) == 0
	})
}

// unsettledOnly drops the messages a check settled or lost: the forwarder
// hands Check only the receipts it still keeps.
func unsettledOnly(msgs []sent, status []forwarder.Status) []sent {
	var out []sent
	for i, m := range msgs {
		if status[i] == forwarder.Unsettled {
			out = append(out, m)
		}
	}
	return out
}

// auditedOnce publishes three messages, waits for the consumer to have
// them and checks them: an audit running every interval has run once.
func (a *audited) auditedOnce(received func() int) []sent {
	a.t.Helper()
	earlier := a.publish(3)
	outflowtest.WaitFor(a.t, 30*time.Second, "the group to receive the earlier messages", func() bool { return received() == len(earlier) })
	requireStatus(a.t, "earlier messages", a.check(earlier), notLost)
	return earlier
}

// consume subscribes a group to every broker topic of the topic and acks
// what it receives; received reports how many distinct messages arrived.
func (a *audited) consume(group string) (received func() int, stop func()) {
	has, stop := a.consumeIDs(group)
	return func() int { return has() }, stop
}

// receivedAll reports whether every one of msgs arrived, has being
// consumeIDs's.
func receivedAll(has func(ids ...string) int, msgs []sent) bool {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.messageID
	}
	return has(ids...) == len(ids)
}

// consumeIDs is consume, whose has(ids...) counts how many of ids arrived
// (all that arrived, without ids).
func (a *audited) consumeIDs(group string) (has func(ids ...string) int, stop func()) {
	a.t.Helper()
	msgs, unsubscribe := subscribeAs(a.t, a.target.Backend, group, a.topic)
	seen := make(chan string, 1024)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case m := <-msgs:
				m.Ack()
				select {
				case seen <- m.UUID:
				case <-quit:
					return
				}
			case <-quit:
				return
			}
		}
	}()
	got := map[string]bool{}
	return func(ids ...string) int {
			for drained := false; !drained; {
				select {
				case id := <-seen:
					got[id] = true
				default:
					drained = true
				}
			}
			if len(ids) == 0 {
				return len(got)
			}
			n := 0
			for _, id := range ids {
				if got[id] {
					n++
				}
			}
			return n
		}, func() {
			select {
			case <-quit:
			default:
				close(quit)
			}
			<-done
			unsubscribe()
		}
}

// requireStatus fails unless every message has want, naming the others.
func requireStatus(t *testing.T, what string, status []forwarder.Status, want func(forwarder.Status) bool) {
	t.Helper()
	for i, s := range status {
		if !want(s) {
			t.Fatalf("%s: message %d of %d is %s", what, i, len(status), statusName(s))
		}
	}
}

func statusName(s forwarder.Status) string {
	switch s {
	case forwarder.Unsettled:
		return "Unsettled"
	case forwarder.Settled:
		return "Settled"
	case forwarder.Lost:
		return "Lost"
	}
	return fmt.Sprintf("Status(%d)", s)
}

func is(s forwarder.Status) func(forwarder.Status) bool {
	return func(x forwarder.Status) bool { return x == s }
}

func notLost(s forwarder.Status) bool { return s != forwarder.Lost }

func receiptsContract(t *testing.T, target AuditTarget) {
	a := newAudited(t, target)
	msgs := a.publish(12)
	topics := target.Backend.Topics(a.topic)
	seen := map[forwarder.Receipt]bool{}
	for i, m := range msgs {
		if !slices.Contains(topics, m.receipt.BrokerTopic) {
			t.Fatalf("message %d: receipt on %q, not one of the topic's broker topics %v", i, m.receipt.BrokerTopic, topics)
		}
		if seen[m.receipt] {
			t.Fatalf("message %d: receipt %+v given twice", i, m.receipt)
		}
		seen[m.receipt] = true
	}
}

func unreadContract(t *testing.T, target AuditTarget) {
	a := newAudited(t, target)
	msgs := a.publish(6)
	requireStatus(t, "first check, nobody reads the topic", a.check(msgs), is(forwarder.Unsettled))
	requireStatus(t, "second check", a.check(msgs), is(forwarder.Unsettled))
}

func acknowledgedContract(t *testing.T, target AuditTarget) {
	a := newAudited(t, target)
	received, stop := a.consume(Group)
	defer stop()
	msgs := a.publish(6)
	outflowtest.WaitFor(t, 30*time.Second, "the group to receive every message", func() bool { return received() == len(msgs) })
	a.settle(msgs, "every acknowledged message Settled")
}

// lossContract: messages published, lost with the broker's data, and new
// ones published after; with audited, a Check ran before the loss. A
// consumer group reads throughout: after the loss it reads the new
// messages, past the lost ones' positions, and must not make them look
// acknowledged.
func lossContract(t *testing.T, target AuditTarget, audited bool) {
	a := newAudited(t, target)
	has, stop := a.consumeIDs(Group)
	defer stop()
	before := a.publish(6)
	if audited {
		requireStatus(t, "before the loss", a.check(before), notLost)
		before = a.publish(6) // the first six may be settled now
	}
	target.Lose(t, a.topic)
	after := a.publish(4)
	outflowtest.WaitFor(t, 60*time.Second, "the group to receive the messages published after the loss", func() bool {
		return receivedAll(has, after)
	})
	status := a.check(append(slices.Clone(before), after...))
	requireStatus(t, "messages the broker lost", status[:len(before)], is(forwarder.Lost))
	requireStatus(t, "messages published after the loss", status[len(before):], notLost)
}

func failoverContract(t *testing.T, target AuditTarget) {
	if target.HoldBack == nil {
		t.Log("brokertest: no HoldBack: a failover cannot be staged on this broker")
		return
	}
	a := newAudited(t, target)
	received, stop := a.consume(Group)
	defer stop()
	before := a.publish(4)
	outflowtest.WaitFor(t, 30*time.Second, "the group to receive the first messages", func() bool { return received() == len(before) })
	requireStatus(t, "before the failover", a.check(before), notLost)
	failOver := target.HoldBack(t, a.topic)
	lost := a.publish(3)
	outflowtest.WaitFor(t, 30*time.Second, "the group to receive the messages the failover will lose", func() bool {
		return received() == len(before)+len(lost)
	})
	failOver()
	after := a.publish(4)
	// The group reads on past the lost messages' positions, as it does
	// after a real failover.
	outflowtest.WaitFor(t, 60*time.Second, "the group to receive the messages published after the failover", func() bool {
		return received() == len(before)+len(lost)+len(after)
	})
	status := a.check(slices.Concat(before, lost, after))
	requireStatus(t, "messages before the failover", status[:len(before)], notLost)
	requireStatus(t, "messages the failover lost", status[len(before):len(before)+len(lost)], is(forwarder.Lost))
	requireStatus(t, "messages after the failover", status[len(before)+len(lost):], notLost)
}

// trimContract: messages every group acknowledged are trimmed, before
// any Check settled them, after a Check of earlier messages (an audit
// running every interval has run once). Without Trim, Check trims what it
// settles; the late messages' receipts reach it only after that.
func trimContract(t *testing.T, target AuditTarget) {
	a := newAudited(t, target)
	received, stop := a.consume(Group)
	defer stop()
	earlier := a.auditedOnce(received)
	late := a.publish(3)
	msgs := a.publish(6)
	outflowtest.WaitFor(t, 30*time.Second, "the group to receive every message", func() bool {
		return received() == len(earlier)+len(late)+len(msgs)
	})
	// The group acknowledges asynchronously: wait until the broker says
	// so, through its lag, before anything is removed.
	waitAcknowledged(t, target.Backend, Group, a.topic)
	if target.Trim != nil {
		target.Trim(t, a.topic)
	}
	a.settle(msgs, "every acknowledged message Settled")
	requireStatus(t, "acknowledged messages whose receipts came after the trim", a.check(late), notLost)
}

// deleteContract: messages every group acknowledged are deleted one by
// one, before any Check settled them.
func deleteContract(t *testing.T, target AuditTarget) {
	if target.Delete == nil {
		t.Log("brokertest: no Delete: this broker cannot delete one message")
		return
	}
	a := newAudited(t, target)
	received, stop := a.consume(Group)
	defer stop()
	earlier := a.auditedOnce(received)
	msgs := a.publish(6)
	outflowtest.WaitFor(t, 30*time.Second, "the group to receive every message", func() bool {
		return received() == len(earlier)+len(msgs)
	})
	waitAcknowledged(t, target.Backend, Group, a.topic)
	rs := make([]forwarder.Receipt, 0, len(msgs))
	for _, m := range msgs[:4] {
		rs = append(rs, m.receipt)
	}
	target.Delete(t, rs)
	requireStatus(t, "acknowledged messages deleted", a.check(msgs), notLost)
}

func newGroupContract(t *testing.T, target AuditTarget) {
	a := newAudited(t, target)
	received, stop := a.consume(Group)
	msgs := a.publish(6)
	outflowtest.WaitFor(t, 30*time.Second, "the group to receive every message", func() bool { return received() == len(msgs) })
	waitAcknowledged(t, target.Backend, Group, a.topic)
	stop()
	a.settle(msgs, "every acknowledged message Settled")
	if target.Trim != nil {
		target.Trim(t, a.topic)
	}
	late, stopLate := a.consume(Group + "-late")
	defer stopLate()
	more := a.publish(4)
	outflowtest.WaitFor(t, 30*time.Second, "the late group to receive the new messages", func() bool { return late() >= len(more) })
	requireStatus(t, "messages after a new group joined", a.check(more), notLost)
}

// waitAcknowledged waits until group has nothing of topic left to
// acknowledge, as the backend's lag tells (every auditing backend reports
// it).
func waitAcknowledged(t *testing.T, b brokers.Backend, group, topic string) {
	t.Helper()
	lr, ok := b.(brokers.LagReporter)
	if !ok {
		t.Fatalf("brokertest: the %s backend is not a brokers.LagReporter", b.Kind())
	}
	waitLag(t, func() brokers.Lag {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := lr.Lag(ctx, group, topic)
		if err != nil {
			t.Fatalf("Lag: %v", err)
		}
		return l
	}, "nothing left to acknowledge", func(l brokers.Lag) bool { return l.Events == 0 })
}

func lostGroupContract(t *testing.T, target AuditTarget) {
	a := newAudited(t, target)
	const other = Group + "-b"
	hasA, stopA := a.consumeIDs(Group)
	defer stopA()
	hasB, stopB := a.consumeIDs(other)
	first := a.publish(4)
	outflowtest.WaitFor(t, 30*time.Second, "both groups to receive the first messages", func() bool {
		return receivedAll(hasA, first) && receivedAll(hasB, first)
	})
	waitAcknowledged(t, target.Backend, Group, a.topic)
	waitAcknowledged(t, target.Backend, other, a.topic)
	a.settle(first, "the first messages Settled")
	stopB() // its consumer is down when the data goes, and comes back later

	target.Lose(t, a.topic)
	after := a.publish(4)
	outflowtest.WaitFor(t, 60*time.Second, "the first group, back, to receive the new messages", func() bool { return receivedAll(hasA, after) })
	waitAcknowledged(t, target.Backend, Group, a.topic)
	requireStatus(t, "new messages the second group, lost with the data, has not read", a.check(after), is(forwarder.Unsettled))

	hasB, stopB = a.consumeIDs(other)
	defer stopB()
	outflowtest.WaitFor(t, 60*time.Second, "the second group, back, to receive the new messages", func() bool { return receivedAll(hasB, after) })
	waitAcknowledged(t, target.Backend, other, a.topic)
	a.settle(after, "the new messages Settled once both groups have them")
}
