package kafka

import (
	"log/slog"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
)

// recordBatchOverhead is what a v2 record batch adds to its records (its
// header, with the log overhead): Kafka checks the whole batch against a
// topic's max.message.bytes.
const recordBatchOverhead = 61

// topicCeiling reads, when the backend opens, the smallest
// max.message.bytes Kafka applies to the backend's topics: the cluster's
// message.max.bytes (the default of every topic without an override, the
// topics Outflow creates included) and the overrides of the topics that
// exist under TopicPrefix. Without a prefix, the cluster's alone: the
// backend's topics cannot be told from any other's, and another team's
// topic with a small limit must not refuse this service's events (a topic
// of its own with an override is then the broker's to refuse, parked as
// the row's fault). 0 when none could
// be read (an ACL without DescribeConfigs): the producer's limit alone
// applies, and a record over a topic's is the broker's to refuse, as the
// row's fault.
func (b *kafkaBackend) topicCeiling(logger *slog.Logger) int {
	least := 0
	take := func(v *string) {
		if v == nil {
			return
		}
		if n, err := strconv.Atoi(*v); err == nil && n > 0 && (least == 0 || n < least) {
			least = n
		}
	}
	if brokers := b.client.Brokers(); len(brokers) > 0 {
		entries, err := b.admin.DescribeConfig(sarama.ConfigResource{Type: sarama.BrokerResource,
			Name: strconv.Itoa(int(brokers[0].ID())), ConfigNames: []string{"message.max.bytes"}})
		if err != nil {
			logger.Debug("kafka: cannot read the cluster's message.max.bytes", "error", err)
		}
		for _, e := range entries {
			if e.Name == "message.max.bytes" {
				take(&e.Value)
			}
		}
	}
	if b.cfg.Kafka.TopicPrefix == "" {
		return least
	}
	topics, err := b.admin.ListTopics()
	if err != nil {
		logger.Debug("kafka: cannot read the topics' max.message.bytes", "error", err)
	}
	for name, d := range topics {
		if strings.HasPrefix(name, b.cfg.Kafka.TopicPrefix) {
			take(d.ConfigEntries["max.message.bytes"])
		}
	}
	return least
}
