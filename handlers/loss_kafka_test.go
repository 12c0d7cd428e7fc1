package handlers_test

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Kafka loses what it acknowledged between the forwarder's publish and the
// consumers' reads: the topic is deleted, with the consumers absent (their
// workers start after the loss; whoever comes first, the audit or a
// worker's subscribe, creates it again with the configured partitions).
// With the audit on, every check of the end-to-end suite holds; with it
// off, the same failure loses events for good. (There is no "consumers
// present" case: a Kafka client connects to the addresses the cluster
// advertises, so a proxy cannot cut the workers off alone.)
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
	brokerLoss{direct: direct, cut: func() {}, uncut: func() {}, lose: lose, brokerTopics: 1}.run(t, p, false, audit)
}
