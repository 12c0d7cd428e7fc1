package consumer

import (
	"github.com/outflow-dev/outflow/brokers"
)

// ReplayTopicPrefix starts every handler's replay topic.
const ReplayTopicPrefix = brokers.ReplayTopicPrefix

// ReplayKey is the routing key (forwarder.Outgoing.AggregateID) a replay
// publishes every message with. One key for all: a partitioned backend puts
// the whole replay on one of the replay topic's partitions, the one
// [ReplayBrokerTopic] names, so the worker reads one broker topic per
// handler for its replays, and the replay keeps its id order across
// aggregates.
const ReplayKey = "outflow.replay"

// ReplayTopic is the topic a replay to the handler named name publishes to
// (package replay, `outflow replay`): only that handler's consumer group
// reads it.
func ReplayTopic(name string) string { return ReplayTopicPrefix + name }

// ReplayBrokerTopic is the broker topic (stream, subject, exchange, table)
// of the handler named name's replays on b: of the broker topics b lists
// for ReplayTopic(name), the one that messages keyed [ReplayKey] go to.
// The built-in backends spread a topic as brokers.PartitionTopic does (the
// key's FNV-1a modulo the partition count, Topics listing the partitions
// in order) or not at all (one topic).
func ReplayBrokerTopic(b brokers.Backend, name string) string {
	topics := b.Topics(ReplayTopic(name))
	return topics[brokers.PartitionIndex(ReplayKey, len(topics))]
}
