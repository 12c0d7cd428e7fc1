package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
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
	addrs := outflowtest.Kafka(t)
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
