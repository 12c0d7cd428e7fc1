// Package watermillpub makes any Watermill [message.Publisher] the
// forwarder's broker, for a broker Outflow has no backend for. Package
// brokers/watermillbackend builds on it a whole brokers.Backend, the workers'
// subscribers included.
//
// What the forwarder's broker contract needs, and what it keeps through
// the adapter:
//
//   - Per-message results: kept. Watermill's Publish is all-or-nothing per
//     call and does not say which message failed (some may have gone out
//     before the error), so [Broker.Publish] calls it once per message, in
//     order, and the error of that call is that message's alone. The cost
//     is one round trip per message: a batch is not pipelined.
//   - Acknowledgement: kept as far as the Publisher keeps it. A message is
//     reported published when the Publisher's Publish returned nil; the
//     forwarder then marks the row. A Publisher that returns before the
//     broker has the message (a buffering or asynchronous one, such as
//     gochannel without persistence) loses what it held when it fails:
//     at-least-once holds only over a Publisher that returns after the
//     broker acknowledged.
//   - Broker unavailable: approximated. Watermill has no error for "the
//     broker, not the message": [Config.Classify] decides. The default
//     counts connection errors ([net.Error], io.EOF, refused or reset
//     connections, a closed network connection) and context errors as the
//     broker's ([forwarder.ErrBrokerUnavailable]: no attempt spent) and
//     everything else as the message's (retried, then parked). A Publisher
//     whose outage errors look different needs its own Classify, or an
//     outage parks rows. After a broker error the rest of the call is not
//     sent (each of its messages gets the same error), as the broker is
//     down.
//   - Per-aggregate order: kept. The forwarder hands a Publish at most one
//     row per aggregate and sends an aggregate's next row only after this
//     one was acknowledged; the adapter sends in the order given and
//     returns only when every call returned.
//   - Context: honoured between messages, and while one is being sent:
//     Watermill's Publish takes no context, so on cancellation the adapter
//     returns at once (the messages not acknowledged yet fail as the
//     broker's) and leaves the call running; if it then succeeds, the row
//     is sent again later: a duplicate, which consumers drop by message id.
//   - Payload limits: only if told. A Publisher does not say how large a
//     message its broker takes; with [Config.MaxMessageBytes] set the
//     adapter is a [forwarder.PayloadLimiter] counting payload plus
//     metadata keys and values (or [Config.MessageBytes]), and the
//     forwarder parks a row over it before sending. Without it, a message
//     too large for the broker fails as the message's (if Classify says so)
//     and is parked after MaxAttempts.
//   - Topics: a message goes to [Config.Topic] of it, by default its
//     Outgoing.Topic. Partitioning by aggregate, if the broker has it, is
//     the Publisher's: Outflow puts the aggregate id in no header of its
//     own, so set a Publisher marshaler that keys by the envelope's
//     aggregate id metadata where order across partitions matters.
//
// The broker conformance suite (package brokertest) runs on the adapter
// over watermill-redisstream's publisher.
package watermillpub
