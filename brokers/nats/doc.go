// Package nats is the NATS JetStream backend. Importing it registers the
// backend with package brokers, for [brokers.Open] with [brokers.NATS]; it
// links nats.go and watermill-nats only.
//
// A topic is one JetStream stream capturing the topic's subject and its
// partition subjects; each consumer group is a durable consumer per subject.
// The forwarder side is a [forwarder.PayloadLimiter] (the server's
// max_payload). [Subscriber] is Outflow's batch subscriber over JetStream
// pull consumers. What the backend keeps and lacks is in docs/brokers.md.
package nats
