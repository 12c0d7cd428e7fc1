package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The Auditor contract on kfake, a cluster of each subtest's own:
//   - Lose deletes the topic (Kafka drops its groups' offsets with it) and
//     creates it again with the backend's partitions, as Check does when
//     it finds it missing;
//   - Trim deletes (DeleteRecords) what every group of the backend's
//     prefix has committed past, as retention does;
//   - Delete is nil: Kafka cannot delete one record;
//   - HoldBack is nil. kfake can lose a tail (persistentKafka.truncate puts
//     back an older copy of the log, and TestCheckFindsATruncation shows
//     Check finds it), but the contract's group reads on through the
//     failover, and sarama's consumer, which does not check its position
//     by leader epoch (KIP-320), resumes at its offset in memory on the
//     cut log: the records written below it before its next fetch never
//     reach it (one of the four written after the failover, in 3 of 6
//     runs), and nothing in the receipts shows it (the group's later
//     commits are offsets of the new log). docs/broker-loss.md says so.
func TestAuditContract(t *testing.T) {
	t.Parallel()
	brokertest.RunAudit(t, brokertest.AuditHarness{
		Parallel: true, // each subtest on a server of its own
		Open: func(t *testing.T) brokertest.AuditTarget {
			addrs := testservers.Kafka(t)
			b := openTestKafka(t, addrs)
			return brokertest.AuditTarget{
				Backend: b,
				Lose: func(t *testing.T, topic string) {
					admin := newAdmin(t, addrs)
					require.NoError(t, admin.DeleteTopic("t."+topic))
					// The contract's consumer may have the topic created
					// again already (a metadata request auto-creates it).
					if err := admin.CreateTopic("t."+topic, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1}, false); !errors.Is(err, sarama.ErrTopicAlreadyExists) {
						require.NoError(t, err)
					}
					warmUp(t, b, topic)
				},
				Trim: func(t *testing.T, topic string) { deleteConsumed(t, addrs, "t."+topic) },
			}
		},
	})
}

// newAdmin is a cluster admin on addrs, closed when t ends: one per use
// where the cluster restarts under the test.
func newAdmin(t testing.TB, addrs []string) sarama.ClusterAdmin {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	admin, err := sarama.NewClusterAdmin(addrs, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	return admin
}

// outgoing is n messages of topic over 8 aggregates (every partition gets
// some).
func outgoing(topic string, n int) []forwarder.Outgoing {
	msgs := make([]forwarder.Outgoing, n)
	for i := range msgs {
		msgs[i] = kafkaOutgoing(topic, fmt.Sprint("agg-", i%8), i)
	}
	return msgs
}

// warmUp publishes to topic until a batch over every partition goes
// through: the producer's first sends to a recreated topic fail once
// ("out of order sequence number": the broker has no state of the
// producer, whose sequence numbers restart with the new epoch that failure
// brings). The forwarder retries them as a broker outage.
func warmUp(t testing.TB, b brokers.Backend, topic string) {
	t.Helper()
	outflowtest.WaitFor(t, 20*time.Second, "publishes to the recreated topic to go through", func() bool {
		return !slices.ContainsFunc(b.Broker().Publish(context.Background(), outgoing(topic, 8)), func(err error) bool { return err != nil })
	})
}

// deleteConsumed deletes from every partition of topic the records every
// consumer group of the prefix "t." has committed past.
func deleteConsumed(t testing.TB, addrs []string, topic string) {
	t.Helper()
	admin := newAdmin(t, addrs)
	groups, err := admin.ListConsumerGroups()
	require.NoError(t, err)
	upTo := ends(t, addrs, topic)
	parts := slices.Collect(func(yield func(int32) bool) {
		for p := range upTo {
			if !yield(p) {
				return
			}
		}
	})
	for g := range groups {
		if !strings.HasPrefix(g, "t.") {
			continue
		}
		resp, err := admin.ListConsumerGroupOffsets(g, map[string][]int32{topic: parts})
		require.NoError(t, err)
		for _, p := range parts {
			off := int64(-1)
			if blk := resp.GetBlock(topic, p); blk != nil {
				off = blk.Offset
			}
			if off >= 0 {
				upTo[p] = min(upTo[p], off)
			}
		}
	}
	require.NoError(t, admin.DeleteRecords(topic, upTo))
}

// ends is each partition's high watermark.
func ends(t testing.TB, addrs []string, topic string) map[int32]int64 {
	t.Helper()
	c, err := sarama.NewClient(addrs, sarama.NewConfig())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.RefreshMetadata(topic))
	parts, err := c.Partitions(topic)
	require.NoError(t, err)
	out := map[int32]int64{}
	for _, p := range parts {
		out[p], err = c.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
	}
	return out
}

// commit commits offsets of topic as group, with metadata (a simple
// commit, outside any generation, as a tool resetting offsets does).
func commit(t testing.TB, addrs []string, group, topic string, offsets map[int32]int64, metadata string) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	c, err := sarama.NewClient(addrs, cfg)
	require.NoError(t, err)
	defer c.Close()
	coord, err := c.Coordinator(group)
	require.NoError(t, err)
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: group, ConsumerGroupGeneration: -1, RetentionTime: -1}
	for p, off := range offsets {
		req.AddBlock(topic, p, off, 0, metadata)
	}
	resp, err := coord.CommitOffset(req)
	require.NoError(t, err)
	for _, parts := range resp.Errors {
		for p, kerr := range parts {
			require.ErrorIs(t, kerr, sarama.ErrNoError, "commit of partition %d", p)
		}
	}
}

// topicID is the Kafka topic's id, as the subscriber stamps it.
func topicID(t testing.TB, addrs []string, topic string) string {
	t.Helper()
	desc, err := newAdmin(t, addrs).DescribeTopics([]string{topic})
	require.NoError(t, err)
	require.Len(t, desc, 1)
	return desc[0].Uuid.String()
}

// checked is the Kafka topic of the outbox topic "orders" under audit:
// one Check at a time, its state kept and the unsettled receipts held, as
// the forwarder does.
type checked struct {
	t     *testing.T
	b     brokers.Backend
	a     forwarder.Auditor
	name  string // the Kafka topic
	state []byte
	held  []forwarder.Held
	next  int                           // the next message's number
	sent  map[string]forwarder.Outgoing // by message id, for a repair
}

func newChecked(t *testing.T, b brokers.Backend) *checked {
	a, ok := b.Broker().(forwarder.Auditor)
	require.True(t, ok, "the Kafka broker is no forwarder.Auditor")
	return &checked{t: t, b: b, a: a, name: "t.orders", sent: map[string]forwarder.Outgoing{}}
}

// publish publishes n messages over 8 aggregates (every partition gets
// some), acknowledged on the first try, and holds their receipts.
func (c *checked) publish(n int) []forwarder.Held {
	c.t.Helper()
	held, errs := c.send(n)
	for _, err := range errs {
		require.NoError(c.t, err)
	}
	return held
}

// publishEventually publishes n messages, again until a try takes them
// all (see warmUp), and holds the receipts of that try.
func (c *checked) publishEventually(n int) []forwarder.Held {
	c.t.Helper()
	var held []forwarder.Held
	outflowtest.WaitFor(c.t, 20*time.Second, fmt.Sprintf("%d messages published", n), func() bool {
		var errs []error
		held, errs = c.send(n)
		return !slices.ContainsFunc(errs, func(err error) bool { return err != nil })
	})
	return held
}

func (c *checked) send(n int) ([]forwarder.Held, []error) {
	msgs := make([]forwarder.Outgoing, n)
	for i := range msgs {
		msgs[i] = kafkaOutgoing("orders", fmt.Sprint("agg-", i%8), c.next)
		c.sent[msgs[i].Message.UUID] = msgs[i]
		c.next++
	}
	return c.sendMsgs(msgs)
}

// repair publishes held's messages again, as the forwarder's repair does
// (the same message ids), until a try takes them all.
func (c *checked) repair(held []forwarder.Held) []forwarder.Held {
	c.t.Helper()
	var out []forwarder.Held
	outflowtest.WaitFor(c.t, 20*time.Second, fmt.Sprintf("%d messages published again", len(held)), func() bool {
		msgs := make([]forwarder.Outgoing, len(held))
		for i, h := range held {
			m := c.sent[h.MessageID]
			m.Message = m.Message.Copy()
			msgs[i] = m
		}
		var errs []error
		out, errs = c.sendMsgs(msgs)
		return !slices.ContainsFunc(errs, func(err error) bool { return err != nil })
	})
	return out
}

func (c *checked) sendMsgs(msgs []forwarder.Outgoing) ([]forwarder.Held, []error) {
	n := len(msgs)
	receipts, errs := c.a.PublishReceipts(context.Background(), msgs)
	require.Len(c.t, receipts, n)
	require.Len(c.t, errs, n)
	var held []forwarder.Held
	for i, r := range receipts {
		if errs[i] == nil {
			require.Equal(c.t, c.name, r.BrokerTopic)
			held = append(held, forwarder.Held{Position: r.Position, MessageID: msgs[i].Message.UUID})
		}
	}
	if !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		c.held = append(c.held, held...)
	}
	return held, errs
}

// check checks every held receipt, keeps the state and the unsettled
// ones, and returns the verdict.
func (c *checked) check() forwarder.Verdict {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second) // as the forwarder's loop
	defer cancel()
	v, err := c.a.Check(ctx, c.name, c.state, c.held, false)
	require.NoError(c.t, err)
	require.Len(c.t, v.Status, len(c.held))
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

// statuses returns, for each of msgs, the status v gave it (held as they
// were when v was computed).
func statuses(held []forwarder.Held, v forwarder.Verdict, msgs []forwarder.Held) []forwarder.Status {
	out := make([]forwarder.Status, len(msgs))
	for i, m := range msgs {
		k := slices.Index(held, m)
		if k < 0 {
			out[i] = 255
			continue
		}
		out[i] = v.Status[k]
	}
	return out
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

func all(n int, s forwarder.Status) []forwarder.Status {
	out := make([]forwarder.Status, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// A topic deleted is a loss, whether the Check finds it missing (and
// creates it again, with the backend's partitions, for the repair) or
// already recreated by a publish, however many records the new topic took:
// the records at the held offsets are other messages, or none.
func TestCheckFindsADeletedTopic(t *testing.T) {
	t.Parallel()
	addrs := testservers.Kafka(t)
	c := newChecked(t, openTestKafka(t, addrs))
	admin := newAdmin(t, addrs)

	first := c.publish(20)
	require.Equal(t, all(20, forwarder.Unsettled), c.check().Status, "nobody reads the topic")
	require.NoError(t, admin.DeleteTopic(c.name))
	v := c.check()
	require.Equal(t, all(len(first), forwarder.Lost), v.Status)
	require.Contains(t, v.Reason, "topic missing")
	desc, err := admin.DescribeTopics([]string{c.name})
	require.NoError(t, err)
	require.Len(t, desc[0].Partitions, 4, "the audit created the topic again with the backend's partitions")

	c.publishEventually(20)
	require.Zero(t, count(c.check().Status, forwarder.Lost), "written to the new topic")
	require.NoError(t, admin.DeleteTopic(c.name))
	c.publishEventually(80) // more than before: the offsets alone would not show it
	held := slices.Clone(c.held)
	v = c.check()
	require.Equal(t, 20, count(v.Status, forwarder.Lost), v.Reason)
	require.Equal(t, all(20, forwarder.Lost), v.Status[:20], "the old topic's")
	require.Contains(t, v.Reason, "holds another message")
	require.Zero(t, count(statuses(held, v, held[20:]), forwarder.Lost), "the new topic's")
}

// Retention, or DeleteRecords of what every group consumed, is no loss;
// removing what a group had not consumed is. A record trimmed with no
// group reading the topic is no loss either: a group created later starts
// at the log start.
func TestCheckRetentionOfConsumedRecordsIsNoLoss(t *testing.T) {
	t.Parallel()
	addrs := testservers.Kafka(t)
	c := newChecked(t, openTestKafka(t, addrs))
	admin := newAdmin(t, addrs)

	consumed := c.publish(20)
	end := ends(t, addrs, c.name)
	commit(t, addrs, "t.g", c.name, end, "")
	commit(t, addrs, "t.h", c.name, end, "")
	commit(t, addrs, "other", c.name, map[int32]int64{0: 0, 1: 0, 2: 0, 3: 0}, "") // not Outflow's: not counted
	require.NoError(t, admin.DeleteRecords(c.name, end))
	v := c.check()
	require.Equal(t, all(len(consumed), forwarder.Settled), v.Status, v.Reason)

	c.publish(20)
	half := ends(t, addrs, c.name)
	for p := range half {
		half[p] = end[p] + (half[p]-end[p])/2
	}
	commit(t, addrs, "t.h", c.name, half, "") // t.h behind: it had half of them
	commit(t, addrs, "t.g", c.name, ends(t, addrs, c.name), "")
	require.NoError(t, admin.DeleteRecords(c.name, ends(t, addrs, c.name)))
	held := slices.Clone(c.held)
	v = c.check()
	var short int
	for _, h := range held {
		var p int32
		var o int64
		_, err := fmt.Sscanf(h.Position, "%d:%d", &p, &o)
		require.NoError(t, err)
		if o >= half[p] {
			short++
		}
	}
	require.Equal(t, short, count(v.Status, forwarder.Lost), v.Reason)
	require.Equal(t, len(held)-short, count(v.Status, forwarder.Settled), v.Reason)
	require.Contains(t, v.Reason, "before group t.h consumed it")
}

// A group created after the records it never read were trimmed, with an
// offset on some partitions only, makes nothing lost: a partition it has
// no offset on it reads from the log start, below which the records went.
func TestCheckNewGroupIsNoLoss(t *testing.T) {
	t.Parallel()
	addrs := testservers.Kafka(t)
	c := newChecked(t, openTestKafka(t, addrs))
	admin := newAdmin(t, addrs)

	c.publish(20)
	end := ends(t, addrs, c.name)
	commit(t, addrs, "t.g", c.name, end, "")
	require.NoError(t, admin.DeleteRecords(c.name, end))
	commit(t, addrs, "t.late", c.name, map[int32]int64{0: end[0]}, "") // joined after, read partition 0 from its start
	v := c.check()
	require.Equal(t, all(20, forwarder.Settled), v.Status, v.Reason)
}

// A topic deleted and recreated between a Check and the next, whose new
// records were trimmed too: the held records below the new topic's log
// start may be the old topic's, whose groups' offsets Kafka dropped. They
// are lost, though every group of the new topic committed past them.
func TestCheckRecreatedAndTrimmedIsLoss(t *testing.T) {
	t.Parallel()
	addrs := testservers.Kafka(t)
	b := openTestKafka(t, addrs)
	c := newChecked(t, b)
	admin := newAdmin(t, addrs)

	c.publish(8)
	require.Zero(t, count(c.check().Status, forwarder.Lost)) // the state keeps the topic id
	require.NoError(t, admin.DeleteTopic(c.name))
	require.NoError(t, admin.CreateTopic(c.name, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1}, false))
	warmUp(t, b, "orders")
	warmUp(t, b, "orders")
	end := ends(t, addrs, c.name)
	commit(t, addrs, "t.g", c.name, end, "")
	require.NoError(t, admin.DeleteRecords(c.name, end))
	v := c.check()
	require.Equal(t, all(8, forwarder.Lost), v.Status, v.Reason)
	require.Contains(t, v.Reason, "recreated since the last audit")
}

// A truncation (here a log restored from an older copy: the topic keeps its
// id) loses what was written after the copy, though the group had
// committed past it: its offsets are in the log that was cut. Once the
// log grows past them again, the group's offset is valid to Kafka, but it
// names a record that is not there: Check does not count it, and settles
// nothing of the new records until the group commits again.
func TestCheckFindsATruncation(t *testing.T) {
	t.Parallel()
	k := startPersistentKafka(t)
	b := openTestKafka(t, k.Addrs)
	c := newChecked(t, b)

	kept := c.publish(12)
	k.snapshot()
	lost := c.publish(12)
	// The group consumed everything, as its subscriber stamps it: the
	// message id of the record before each committed offset.
	id := topicID(t, k.Addrs, c.name)
	commitLast(t, k.Addrs, "t.g", c.name, id, append(slices.Clone(kept), lost...))
	k.truncate(c.name)

	held := slices.Clone(c.held)
	v := c.check()
	// The group's offsets are past the log's end: not counted, so what it
	// had of the records kept is not settled until it commits again.
	require.Equal(t, all(len(kept), forwarder.Unsettled), statuses(held, v, kept), v.Reason)
	require.Equal(t, all(len(lost), forwarder.Lost), statuses(held, v, lost), v.Reason)
	require.Contains(t, v.Reason, "high watermark")

	again := c.publishEventually(36) // the log grows past the group's offsets
	held = slices.Clone(c.held)
	v = c.check()
	require.Equal(t, all(len(again), forwarder.Unsettled), statuses(held, v, again), "the group's offsets name records of the log that was cut: "+v.Reason)
}

// commitLast commits, as group, the offset after the last of held on each
// partition, stamped as the subscriber stamps it.
func commitLast(t testing.TB, addrs []string, group, topic, id string, held []forwarder.Held) {
	t.Helper()
	last := map[int32]forwarder.Held{}
	offs := map[int32]int64{}
	for _, h := range held {
		var p int32
		var o int64
		_, err := fmt.Sscanf(h.Position, "%d:%d", &p, &o)
		require.NoError(t, err)
		if o+1 > offs[p] {
			offs[p], last[p] = o+1, h
		}
	}
	for p, o := range offs {
		commit(t, addrs, group, topic, map[int32]int64{p: o}, id+" "+last[p].MessageID)
	}
}
