package handlers_test

import (
	"testing"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/internal/testservers"
)

func init() {
	backends = append(backends, testBackend{brokers.AMQP, func(t *testing.T) brokers.Backend {
		// Every group the suite's workers run: the forwarder declares their
		// queues before its first publish, which happens before any worker
		// starts.
		groups := consumer.HandlerGroups(
			consumer.Handler{Name: "sync-analytics", Topic: app.PaymentsTopic},
			consumer.Handler{Name: "notify-merchant", Topic: app.PaymentsTopic},
			consumer.Handler{Name: "counter", Topic: app.PaymentsTopic})
		return openBackend(t, brokers.Config{Kind: brokers.AMQP, StreamPartitions: 2,
			AMQP: brokers.AMQPConfig{URL: testservers.AMQPURL(), Prefix: testservers.AMQPPrefix(t, 2, groups), Groups: groups}})
	}})
}
