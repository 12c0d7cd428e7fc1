package handlers_test

import (
	"testing"
	"time"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/testservers"
)

// Kafka runs on an in-process kfake cluster of its own per test. A stopped
// worker's partitions move after SessionTimeout: 2 s, not the default 10.
func init() {
	backends = append(backends, testBackend{brokers.Kafka, func(t *testing.T) brokers.Backend {
		return openBackend(t, brokers.Config{Kind: brokers.Kafka, StreamPartitions: 2,
			Kafka: brokers.KafkaConfig{Brokers: testservers.Kafka(t), TopicPartitions: 4, SessionTimeout: 2 * time.Second}})
	}})
}
