package handlers_test

import (
	"testing"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/outflowtest"
)

func init() {
	backends = append(backends, testBackend{brokers.AMQP, func(t *testing.T) brokers.Backend {
		// Every group the suite's workers run: the forwarder declares their
		// queues before its first publish, which happens before any worker
		// starts.
		groups := map[string][]string{app.PaymentsTopic: {"sync-analytics", "notify-merchant", "counter"}}
		for _, g := range groups[app.PaymentsTopic] { // and each one's replay topic (consumer.ReplayTopic)
			groups[consumer.ReplayTopic(g)] = []string{g}
		}
		return openBackend(t, brokers.Config{Kind: brokers.AMQP, Partitions: 2,
			AMQP: brokers.AMQPConfig{URL: outflowtest.AMQPURL(), Prefix: outflowtest.AMQPPrefix(t, 2, groups), Groups: groups}})
	}})
}
