package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
)

// Every handler's group reads its topic, and its replay topic unless it
// has none: RabbitMQ must declare both before the forwarder publishes.
func TestHandlerGroups(t *testing.T) {
	t.Parallel()
	got := consumer.HandlerGroups(
		consumer.Handler{Name: "a", Topic: "t"},
		consumer.Handler{Name: "b", Topic: "t", NoReplay: true},
		consumer.Handler{Name: "a", Topic: "t"},
	)
	require.Equal(t, map[string][]string{"t": {"a", "b"}, consumer.ReplayTopic("a"): {"a"}}, got)
}

// A replay goes to the broker topic the consumer reads: the partition its
// key maps to, as the forwarder's partitioning names it.
func TestReplayBrokerTopicIsTheKeysPartition(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 3, 16} {
		want := brokers.PartitionTopic("p.", consumer.ReplayTopic("h"), n, consumer.ReplayKey)
		require.Equal(t, want, consumer.ReplayBrokerTopic(partitioned{prefix: "p.", n: n}, "h"), "%d partitions", n)
	}
}

// partitioned is a backend reduced to its topic naming, as the redis, nats
// and amqp backends name their partitions.
type partitioned struct {
	brokers.Backend
	prefix string
	n      int
}

func (p partitioned) Topics(topic string) []string {
	return brokers.PartitionTopics(p.prefix, topic, p.n)
}
