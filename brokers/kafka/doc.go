// Package kafka is the Kafka backend (sarama, watermill-kafka's wire
// format). Importing it registers the backend with package brokers, for
// [brokers.Open] with [brokers.Kafka]; it links sarama and watermill-kafka
// only.
//
// The record key is the aggregate id, so one aggregate stays on one
// partition, in order. The forwarder side is a [forwarder.PayloadLimiter]
// (the producer's MaxMessageBytes). What the backend keeps and lacks is in
// docs/brokers.md.
package kafka
