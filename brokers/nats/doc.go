// Package nats is the NATS JetStream backend. Importing it registers the
// backend with package brokers, for [brokers.Open] with [brokers.NATS]; it
// links nats.go and watermill-nats only.
//
// A topic is one JetStream stream capturing the topic's subject and its
// partition subjects; each consumer group is a durable consumer per subject.
// The forwarder side is a [forwarder.PayloadLimiter] (the server's
// max_payload). [Subscriber] is Outflow's batch subscriber over JetStream
// pull consumers. What the backend keeps and lacks is in docs/brokers.md.
//
// Lag (brokers.LagReporter) sums over the topic's subjects the group's
// durable consumer's NumPending (not delivered) and NumAckPending
// (delivered, not acked); the oldest age is the stored time of the
// subject's first message after the consumer's ack floor, so a message
// acked out of order ahead of an unacked one does not hide the older one.
// A consumer not created yet lags by every message of its subject (it will
// deliver all); a stream not created yet, by nothing. Lag reads consumer
// info, stream info and one message per subject, and creates nothing.
// Ping is a JetStream account info request: the JetStream server answers,
// not only the core connection.
//
// The forwarder side is also a [forwarder.Auditor] (docs/broker-loss.md):
// a receipt is the subject and the stream sequence of the PubAck. Check
// looks for each held message by sequence and compares its message id (a
// sequence JetStream reused after a tail loss holds another message); one
// found is settled once every consumer reading the subject acknowledged
// it; one missing is lost when the stream is missing, was created again,
// or went back below it, and settled only when every consumer reading the
// subject shows it had it (its ack floor, and, as JetStream moves ack
// floors over what a purge or a limit removes, its delivery count since
// the last Check). A consumer list, a stream info and one message get per
// held message. A publish that finds its stream missing creates it again
// (once it has been missing recreateDelay: nats-server 2.9 removes a
// deleted stream's files after answering the delete) and sends again; the
// subscriber creates a lost durable consumer again.
//
// Replicas (brokers.NATSConfig.Replicas, --nats-replicas, 1 to 5, default
// 1) is the replica count of every stream the backend creates; a stream
// that exists keeps its own. Three replicas on a three-node cluster keep
// the stream, and what it acknowledged, through one node's loss, at a cost
// in publish throughput measured in docs/benchmarks.md.
package nats
