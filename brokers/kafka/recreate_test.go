package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
)

// Known limit, not fixed (docs/broker-loss.md, "A consumer running through
// the deletion"): a consumer that keeps running while its topic is deleted
// and recreated resumes at its old in-memory offsets on the new topic, and
// skips what each partition holds below them (here 10 records a
// partition: 40 of the new topic's records never arrive). The audit's
// repair publishes the rows again, but this consumer does not read them.
// A fix belongs to the subscriber (watch the topic id, restart the group
// at the new topic's start): remove the Skip with it.
func TestKafkaConsumerRunningThroughTopicDeletion(t *testing.T) {
	t.Skip("known limit: a running consumer skips the recreated topic's first records (docs/broker-loss.md)")
	t.Parallel()
	b, au, admin, addrs := openAuditedKafka(t, "orders")
	sub, err := b.Subscriber("g", "w1", brokers.SubscriberOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { sub.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, "t.orders")
	require.NoError(t, err)
	publishKafka(t, b, "orders", 40)
	for range 40 {
		m := <-ch
		m.Ack()
	}
	t.Log("consumed 40")
	au.requireNoLoss("baseline")
	require.NoError(t, admin.DeleteTopic("t.orders"))
	loss := au.audit()
	t.Logf("loss %+v", loss)
	publishEventually(t, b, "orders", 80)
	total := kafkaRecords(t, addrs, "t.orders")
	seen := map[string]bool{}
	deadline := time.After(30 * time.Second)
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
