package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Kafka loses what it acknowledged between the forwarder's publish and the
// consumers' reads: the topic is deleted, with the consumers absent (their
// workers start after the loss; whoever comes first, the audit or a
// worker's subscribe, creates it again with the configured partitions).
// No audit need have run before: the loss is found from the receipts the
// forwarder kept with its marks. With the audit on, every check of the
// end-to-end suite holds; with it off, the same failure loses events for
// good. The consumers cannot be cut off alone (a Kafka client connects to
// the addresses the cluster advertises, so a proxy cannot stand between
// them and the broker): with the consumers present, they run through the
// deletion (kafkaLossPresent).
func TestKafkaLossRepaired(t *testing.T) {
	t.Parallel()
	for _, audit := range []bool{true, false} {
		name := "consumers absent, audit on"
		if !audit {
			name = "consumers absent, audit off"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			kafkaLoss(t, audit)
		})
	}
	t.Run("consumers present through the deletion, audit on", func(t *testing.T) {
		t.Parallel()
		kafkaLossPresent(t)
	})
}

func kafkaLoss(t *testing.T, audit bool) {
	addrs := testservers.Kafka(t)
	cfg := brokers.Config{Kind: brokers.Kafka, StreamPartitions: 2, Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPartitions: 4}}
	p := newPipeline(t)
	p.backend = openBackend(t, cfg)
	direct := openBackend(t, cfg)
	lose := func(t *testing.T) {
		admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
		require.NoError(t, err)
		defer admin.Close()
		require.NoError(t, admin.DeleteTopic(app.PaymentsTopic))
	}
	brokerLoss{direct: direct, cut: func() {}, uncut: func() {}, lose: lose}.run(t, p, false, audit)
}

// kafkaLossPresent: the workers keep running while the topic is deleted
// and the audit creates it again. The first events were applied by every
// consumer and settled by the audit (their receipts forgotten): the
// deletion takes nothing any consumer needs, and the repair does not put
// them back. The next ones are held unsettled by a group that reads the
// topic and has not consumed them (a simple commit at the end of the first
// events, as a handler lagging behind leaves it): the deletion loses them,
// and the audit publishes them again. So the new topic holds, below the
// offsets the running consumers had reached on the old one, only the
// repaired events and those published after: every one must be applied,
// which a consumer resuming at its old offsets would not do.
func kafkaLossPresent(t *testing.T) {
	ctx := context.Background()
	addrs := testservers.Kafka(t)
	cfg := brokers.Config{Kind: brokers.Kafka, StreamPartitions: 2, Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPartitions: 4,
		TopicCheckInterval: 200 * time.Millisecond}}
	p := newPipeline(t)
	p.backend = openBackend(t, cfg)
	direct := openBackend(t, cfg)
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)
	reg := prometheus.NewRegistry()
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: direct.Broker(), PollInterval: 50 * time.Millisecond,
		BatchSize: 20, AuditInterval: 100 * time.Millisecond, Registerer: reg, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)
	run(t, p.worker(t, time.Second, counter).Run)

	receipts := func() int {
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(outbox_ids)), 0) FROM outbox_receipts`).Scan(&n))
		return n
	}
	want := p.drive(t, m.ID, 20)
	outflowtest.WaitFor(t, 30*time.Second, "the first events applied by every consumer and settled by the audit", func() bool {
		var deliveries int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoint_deliveries`).Scan(&deliveries))
		return p.stats(t, m.ID) == want && len(counted()) == p.events(t) &&
			deliveries == len(p.messageIDs(t, paymentevents.PaidType, paymentevents.RefundedType)) && receipts() == 0
	})
	commitEnds(t, addrs, "lagging", app.PaymentsTopic)
	add := func(s app.CurrencyStats) {
		want.PaidCount += s.PaidCount
		want.PaidAmount = want.PaidAmount.Plus(s.PaidAmount)
		want.RefundedAmount = want.RefundedAmount.Plus(s.RefundedAmount)
	}
	add(p.drive(t, m.ID, 10))
	outflowtest.WaitFor(t, 30*time.Second, "the next events published", func() bool {
		var pending int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&pending))
		return pending == 0
	})
	require.Positive(t, receipts(), "the lagging group holds the next events unsettled")

	admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.DeleteTopic(app.PaymentsTopic))
	outflowtest.WaitFor(t, 10*time.Second, "the audit to find the loss", func() bool {
		return metricSum(t, reg, "outflow_forwarder_broker_losses_total") >= 1
	})

	add(p.drive(t, m.ID, 20))
	outflowtest.WaitFor(t, 60*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.GreaterOrEqual(t, metricSum(t, reg, "outflow_forwarder_repaired_total"), 1.0)
}

// commitEnds commits, as group, topic's high watermarks (a simple commit,
// outside any generation): a group that has read the topic up to now.
func commitEnds(t *testing.T, addrs []string, group, topic string) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	c, err := sarama.NewClient(addrs, cfg)
	require.NoError(t, err)
	defer c.Close()
	parts, err := c.Partitions(topic)
	require.NoError(t, err)
	coord, err := c.Coordinator(group)
	require.NoError(t, err)
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: group, ConsumerGroupGeneration: -1, RetentionTime: -1}
	for _, p := range parts {
		end, err := c.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
		req.AddBlock(topic, p, end, 0, "")
	}
	resp, err := coord.CommitOffset(req)
	require.NoError(t, err)
	for _, errs := range resp.Errors {
		for p, kerr := range errs {
			require.ErrorIs(t, kerr, sarama.ErrNoError, "commit of partition %d", p)
		}
	}
}
