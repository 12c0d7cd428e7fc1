package kafka_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// A consumer that keeps running while its topic is deleted and recreated
// reads every record of the new topic (docs/broker-loss.md, "A consumer
// running through the deletion"). Without the subscription's watch of the
// topic id it resumed at its old in-memory offsets on the new topic and
// skipped what each partition held below them: here 10 records a
// partition, 40 of the new topic's records never arrived.
func TestKafkaConsumerRunningThroughTopicDeletion(t *testing.T) {
	t.Parallel()
	addrs := testservers.Kafka(t)
	b := openTestKafka(t, addrs)
	c := newChecked(t, b)
	sub, err := b.Subscriber("g", "w1", brokers.SubscriberOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { sub.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, "t.orders")
	require.NoError(t, err)
	c.publish(40)
	deadline := time.After(30 * time.Second)
	for range 40 {
		select {
		case m := <-ch:
			m.Ack()
		case <-deadline:
			t.Fatal("the first 40 records never arrived")
		}
	}
	require.NoError(t, newAdmin(t, addrs).DeleteTopic("t.orders"))
	// The audit finds the deletion and creates the topic again.
	require.Equal(t, all(40, forwarder.Lost), c.check().Status)
	c.publishEventually(80)
	total := kafkaRecords(t, addrs, "t.orders")
	seen := map[string]bool{}
	deadline = time.After(30 * time.Second)
	for int64(len(seen)) < total {
		select {
		case m := <-ch:
			seen[m.UUID] = true
			m.Ack()
		case <-deadline:
			t.Fatalf("running consumer got %d of %d after the recreation", len(seen), total)
		}
	}
	t.Logf("got all %d", total)
}

// Issue 22, item 6: a truncation cuts the log below the offsets a group
// had committed; the audit finds the records lost and publishes them
// again, and with what else is written they fill the log past the group's
// offsets, which Kafka then takes as valid: the group, back, would resume
// there and skip the repaired records and every other one written since
// the cut. Its commits name the record before each offset (the
// subscriber's stamp): its next session finds another message there, or
// none, and reads the partition from its start. Without that check, the
// group here missed 24 of the 32 records written after the cut (those
// below its offsets: 6 of each partition's 8).
func TestTruncatedGroupReadsTheRepair(t *testing.T) {
	t.Parallel()
	k := startPersistentKafka(t)
	b := openTestKafka(t, k.Addrs)
	c := newChecked(t, b)
	kept := c.publish(8)
	k.snapshot()
	lost := c.publish(24)

	read := func(want []forwarder.Held) {
		t.Helper()
		sub, err := b.Subscriber("g", "w1", brokers.SubscriberOptions{})
		require.NoError(t, err)
		defer sub.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := sub.Subscribe(ctx, c.name)
		require.NoError(t, err)
		missing := map[string]bool{}
		for _, h := range want {
			missing[h.MessageID] = true
		}
		outflowtest.WaitFor(t, 30*time.Second, "the group to read every message", func() bool {
			for {
				select {
				case m := <-ch:
					delete(missing, m.UUID)
					m.Ack()
				default:
					return len(missing) == 0
				}
			}
		})
		// Every ack committed (once a second) before the group leaves.
		lr := b.(brokers.LagReporter)
		outflowtest.WaitFor(t, 30*time.Second, "the group's offsets committed", func() bool {
			lag, err := lr.Lag(context.Background(), "g", "orders")
			require.NoError(t, err)
			return lag.Events == 0
		})
	}
	read(slices.Concat(kept, lost))
	k.truncate(c.name)

	v := c.check()
	require.Equal(t, len(lost), count(v.Status, forwarder.Lost), v.Reason)
	// New records first: the repair alone would put the same messages back
	// at the same offsets, and the group would miss nothing.
	more := c.publishEventually(32)
	repaired := c.repair(lost) // past the group's offsets on every partition
	read(slices.Concat(more, repaired))
}
