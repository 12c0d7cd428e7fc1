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
	"github.com/outflow-dev/outflow/outflowtest"
)

// Kafka loses what it acknowledged between the forwarder's publish and the
// consumers' reads: the topic is deleted, with the consumers absent (their
// workers start after the loss; whoever comes first, the audit or a
// worker's subscribe, creates it again with the configured partitions).
// With the audit on, every check of the end-to-end suite holds; with it
// off, the same failure loses events for good. The consumers cannot be
// cut off alone (a Kafka client connects to the addresses the cluster
// advertises, so a proxy cannot stand between them and the broker): with
// the consumers present, they run through the deletion, having applied
// everything, and what matters is what follows (kafkaLossPresent).
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
	addrs := outflowtest.Kafka(t)
	cfg := brokers.Config{Kind: brokers.Kafka, Partitions: 2, Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPartitions: 4}}
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

// kafkaLossPresent: the workers keep running while the topic is deleted and
// the audit creates it again; the events published afterwards land on the
// new topic below the offsets the consumers had reached on the old one,
// and every one must be applied. AuditMargin is short so that the repair
// puts back nothing the consumers had applied long before (with the
// default 30 s it would put back every row of the test, filling each new
// partition up to the old offsets, and hide a consumer that resumed there);
// so the loss must take nothing a consumer still needed: every consumer,
// NotifyMerchant included, has applied the first events before it.
func kafkaLossPresent(t *testing.T) {
	ctx := context.Background()
	addrs := outflowtest.Kafka(t)
	cfg := brokers.Config{Kind: brokers.Kafka, Partitions: 2, Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPartitions: 4,
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

	want := p.drive(t, m.ID, 20)
	outflowtest.WaitFor(t, 30*time.Second, "the first events applied by every consumer", func() bool {
		var deliveries int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries`).Scan(&deliveries))
		return p.stats(t, m.ID) == want && len(counted()) == p.events(t) &&
			deliveries == len(p.messageIDs(t, paymentevents.PaidType, paymentevents.RefundedType))
	})
	outflowtest.WaitFor(t, 10*time.Second, "the audit's baseline", func() bool {
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_audit WHERE state IS NOT NULL`).Scan(&n))
		return n == 1
	})

	admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.DeleteTopic(app.PaymentsTopic))
	outflowtest.WaitFor(t, 10*time.Second, "the audit to find the loss", func() bool {
		return metricSum(t, reg, "outflow_forwarder_broker_losses_total") >= 1
	})

	more := p.drive(t, m.ID, 20)
	want.PaidCount += more.PaidCount
	want.PaidAmount = want.PaidAmount.Plus(more.PaidAmount)
	want.RefundedAmount = want.RefundedAmount.Plus(more.RefundedAmount)
	outflowtest.WaitFor(t, 60*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
}
