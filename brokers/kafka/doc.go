// Package kafka is the Kafka backend (sarama, watermill-kafka's wire
// format). Importing it registers the backend with package brokers, for
// [brokers.Open] with [brokers.Kafka]; it links sarama and watermill-kafka
// only.
//
// The record key is the aggregate id, so one aggregate stays on one
// partition, in order. The forwarder side is a [forwarder.PayloadLimiter]
// (the producer's MaxMessageBytes). What the backend keeps and lacks is in
// docs/brokers.md.
//
// Lag (brokers.LagReporter) sums over the topic's partitions the records
// between the group's committed offset and the end offset; a partition the
// group has no offset for lags from its oldest record (where a new group
// starts). Records delivered and acked but not yet committed (the offsets
// are committed once a second) still count, and the count includes
// records a transaction aborted or compacted away, as Kafka's own lag
// does. The oldest age is the timestamp of the record at the committed
// offset: one fetch per lagging partition, by a partition consumer outside
// the group. Lag creates no topic (its metadata request does not
// auto-create) and joins no group. Ping is a cluster metadata request.
//
// The forwarder side is also a [forwarder.Auditor] (audit.go): a receipt
// is the record's partition and offset; Check judges each held record by
// the topic's id and partitions, each partition's log start offset and
// high watermark, the record at its offset (compared by message id) and
// the committed offsets of the consumer groups of the backend's prefix;
// see docs/broker-loss.md.
//
// The subscriber (subscriber.go) survives its topic's deletion and
// recreation: each subscription reads the topic's id every
// TopicCheckInterval and joins its group again when it changed, and every
// committed offset carries its topic's id, so that a commit the old
// session made on the new topic is read back to the start. A committed
// offset also names the message the group consumed last: a session that
// finds another message before it, or none, reads the partition again from
// its start (a truncation the log has grown past again).
package kafka
