package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// kafkaAuditor audits one Kafka topic, keeping the state between calls.
type kafkaAuditor struct {
	t     testing.TB
	a     forwarder.Auditor
	topic string
	state []byte
}

func (a *kafkaAuditor) audit() *forwarder.Loss {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second) // as the forwarder's loop
	defer cancel()
	next, loss, err := a.a.Audit(ctx, a.topic, a.state)
	require.NoError(a.t, err)
	require.NotEmpty(a.t, next, "no state returned")
	a.state = next
	return loss
}

func (a *kafkaAuditor) requireNoLoss(what string) {
	a.t.Helper()
	if loss := a.audit(); loss != nil {
		a.t.Fatalf("%s: reported a loss: %+v", what, *loss)
	}
}

// openAuditedKafka opens a backend on a kfake cluster of its own (topic
// prefix "t.", 4 partitions) and an admin client to play the losses.
func openAuditedKafka(t *testing.T, topic string) (brokers.Backend, *kafkaAuditor, sarama.ClusterAdmin, []string) {
	t.Helper()
	addrs := outflowtest.Kafka(t)
	b := openTestKafka(t, addrs)
	a, ok := b.Broker().(forwarder.Auditor)
	require.True(t, ok, "the Kafka broker is no forwarder.Auditor")
	require.Equal(t, []string{"t." + topic}, a.Topics(topic))
	require.Equal(t, "t."+topic, a.BrokerTopic(topic, "any"))
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	admin, err := sarama.NewClusterAdmin(addrs, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	return b, &kafkaAuditor{t: t, a: a, topic: "t." + topic}, admin, addrs
}

// publishKafka publishes n events of topic over 8 aggregates (every
// partition gets some).
func publishKafka(t testing.TB, b brokers.Backend, topic string, n int) {
	t.Helper()
	for _, err := range b.Broker().Publish(context.Background(), outgoing(topic, n)) {
		require.NoError(t, err)
	}
}

// publishEventually publishes n events of topic, again until every one
// went through: the producer's first sends to a recreated topic fail once
// ("out of order sequence number": the broker has no state of the
// producer, whose sequence numbers restart only with the new epoch that
// failure brings), and the forwarder retries them as a broker outage.
func publishEventually(t *testing.T, b brokers.Backend, topic string, n int) {
	t.Helper()
	outflowtest.WaitFor(t, 20*time.Second, fmt.Sprintf("%d events published", n), func() bool {
		return !slices.ContainsFunc(b.Broker().Publish(context.Background(), outgoing(topic, n)), func(err error) bool { return err != nil })
	})
}

func outgoing(topic string, n int) []forwarder.Outgoing {
	var msgs []forwarder.Outgoing
	for i := range n {
		msgs = append(msgs, kafkaOutgoing(topic, fmt.Sprint("agg-", i%8), i))
	}
	return msgs
}

// ends is each partition's high watermark.
func ends(t *testing.T, admin sarama.ClusterAdmin, addrs []string, topic string) map[int32]int64 {
	t.Helper()
	c, err := sarama.NewClient(addrs, sarama.NewConfig())
	require.NoError(t, err)
	defer c.Close()
	parts, err := c.Partitions(topic)
	require.NoError(t, err)
	out := map[int32]int64{}
	for _, p := range parts {
		out[p], err = c.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
	}
	return out
}

// Baselines, growth, and trims (DeleteRecords, what retention does) are
// no loss.
func TestKafkaAuditSeesNoLossWhereThereIsNone(t *testing.T) {
	t.Parallel()
	b, au, admin, addrs := openAuditedKafka(t, "orders")

	au.requireNoLoss("baseline of a topic not created yet")
	topics, err := admin.ListTopics()
	require.NoError(t, err)
	require.NotContains(t, topics, "t.orders", "the audit created the topic")
	publishKafka(t, b, "orders", 20)
	au.requireNoLoss("the topic created and written since the baseline")
	publishKafka(t, b, "orders", 20)
	au.requireNoLoss("grown")

	end := ends(t, admin, addrs, "t.orders")
	half := map[int32]int64{}
	for p, h := range end {
		half[p] = h / 2
	}
	require.NoError(t, admin.DeleteRecords("t.orders", half))
	au.requireNoLoss("half of every partition deleted (DeleteRecords)")
	publishKafka(t, b, "orders", 8)
	require.NoError(t, admin.DeleteRecords("t.orders", ends(t, admin, addrs, "t.orders")))
	au.requireNoLoss("written, then every partition emptied by DeleteRecords")
	publishKafka(t, b, "orders", 8)
	au.requireNoLoss("written after the trims")

	au.state = []byte("not json")
	au.requireNoLoss("an unreadable state is a new baseline")
}

// A topic deleted is a loss, found whether the next audit sees it missing
// (the audit then creates it again, with the backend's partitions) or
// already recreated by a publish (another topic id, however many records
// it took since). With no consumer group, Since is the first record's
// time: nothing was consumed.
func TestKafkaAuditSeesADeletedTopic(t *testing.T) {
	t.Parallel()
	b, au, admin, _ := openAuditedKafka(t, "orders")

	before := time.Now().Truncate(time.Millisecond)
	publishKafka(t, b, "orders", 20)
	after := time.Now()
	au.requireNoLoss("baseline")
	publishKafka(t, b, "orders", 5)
	au.requireNoLoss("grown")

	require.NoError(t, admin.DeleteTopic("t.orders"))
	loss := au.audit()
	require.NotNil(t, loss, "a deleted topic")
	require.Contains(t, loss.Reason, "topic missing")
	require.False(t, loss.Since.Before(before) || loss.Since.After(after), "since %s, want the first record's time, in [%s, %s]", loss.Since, before, after)
	desc, err := admin.DescribeTopics([]string{"t.orders"})
	require.NoError(t, err)
	require.Len(t, desc[0].Partitions, 4, "the audit created the topic again with the backend's partitions")
	// From here the samples place the records: written after the new
	// baseline's look, which comes before the first of them.
	before = time.Now().Truncate(time.Millisecond)
	au.requireNoLoss("the topic created again is the new baseline")
	publishEventually(t, b, "orders", 20)
	after = time.Now()
	au.requireNoLoss("written again")
	require.NoError(t, admin.DeleteTopic("t.orders"))
	publishEventually(t, b, "orders", 40) // more than before: the offsets alone would not show it
	loss = au.audit()
	require.NotNil(t, loss, "a recreated topic")
	require.Contains(t, loss.Reason, "topic recreated")
	require.False(t, loss.Since.Before(before) || loss.Since.After(after), "since %s, want in [%s, %s]", loss.Since, before, after)
	au.requireNoLoss("the recreated topic is the new baseline")
}

// commit commits offsets of topic as group (a simple commit, outside any
// generation, as a tool resetting offsets does).
func commit(t testing.TB, addrs []string, group, topic string, offsets map[int32]int64) {
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
		req.AddBlock(topic, p, off, 0, "")
	}
	resp, err := coord.CommitOffset(req)
	require.NoError(t, err)
	for _, parts := range resp.Errors {
		for p, kerr := range parts {
			require.ErrorIs(t, kerr, sarama.ErrNoError, "commit of partition %d", p)
		}
	}
}

// A loss starts where the consumer groups had consumed: records every
// group had committed past at the last audit are not published again.
// Groups outside the backend's prefix are not counted.
func TestKafkaAuditLossStartsAtTheGroupsOffsets(t *testing.T) {
	t.Parallel()
	b, au, admin, addrs := openAuditedKafka(t, "orders")

	publishKafka(t, b, "orders", 20)
	consumed := ends(t, admin, addrs, "t.orders")
	commit(t, addrs, "t.g", "t.orders", consumed)
	commit(t, addrs, "t.h", "t.orders", consumed)
	commit(t, addrs, "other", "t.orders", map[int32]int64{0: 0}) // not Outflow's
	beforeAudit := time.Now().Truncate(time.Millisecond)
	au.requireNoLoss("baseline, everything consumed")
	afterAudit := time.Now()
	publishKafka(t, b, "orders", 20)
	au.requireNoLoss("grown, the new records not consumed")

	require.NoError(t, admin.DeleteTopic("t.orders"))
	loss := au.audit()
	require.NotNil(t, loss)
	require.Contains(t, loss.Reason, "topic missing")
	require.False(t, loss.Since.Before(beforeAudit) || loss.Since.After(afterAudit),
		"since %s, want the first audit's time (the groups had consumed what came before), in [%s, %s]", loss.Since, beforeAudit, afterAudit)
}

// The audit's cost on an 8-partition topic read by 3 groups, in steady
// state (the history full, nothing to fetch): the broker calls and the
// state's size. kfake answers in-process: the figure is the client's work
// and the round trips on loopback, not a real cluster's.
//
//	go test -run '^$' -bench KafkaAudit -benchtime 500x ./brokers/kafka/
func BenchmarkKafkaAudit(b *testing.B) {
	addrs := outflowtest.Kafka(b)
	be, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.Kafka, Logger: kafkaTestLogger,
		Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPrefix: "t.", TopicPartitions: 8}})
	require.NoError(b, err)
	b.Cleanup(func() { be.Close() })
	publishKafka(b, be, "orders", 800)
	offsets := map[int32]int64{}
	for p := range int32(8) {
		offsets[p] = 50
	}
	for i := range 3 {
		commit(b, addrs, fmt.Sprint("t.g", i), "t.orders", offsets)
	}
	au := &kafkaAuditor{t: b, a: be.Broker().(forwarder.Auditor), topic: "t.orders"}
	for i := range maxSamplesForBench {
		publishKafka(b, be, "orders", 8)
		au.requireNoLoss(fmt.Sprint("filling the history, ", i))
	}
	for b.Loop() {
		au.requireNoLoss("steady")
	}
	b.ReportMetric(float64(len(au.state)), "state-bytes")
}

// maxSamplesForBench fills the history (64 samples) and more.
const maxSamplesForBench = 70
