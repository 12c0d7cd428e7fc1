package handlers_test

import (
	"testing"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// Kafka runs on an in-process kfake cluster of its own per test.
func init() {
	backends = append(backends, testBackend{brokers.Kafka, func(t *testing.T) brokers.Backend {
		return openBackend(t, brokers.Config{Kind: brokers.Kafka, Partitions: 2,
			Kafka: brokers.KafkaConfig{Brokers: testservers.Kafka(t), TopicPartitions: 4}})
	}})
}
