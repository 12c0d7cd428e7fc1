package forwarder

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrBrokerUnavailable marks a publish failure that is the broker's, not the
// row's: the connection is down, the broker is loading, read-only or out of
// memory. The forwarder keeps such rows pending without counting an attempt,
// backs off, and tries again.
var ErrBrokerUnavailable = errors.New("broker unavailable")

// Outgoing is one outbox row ready for the broker.
type Outgoing struct {
	// Topic is the row's topic.
	Topic string
	// AggregateID keys per-aggregate ordering (stream partitioning).
	AggregateID string
	// Message carries the message id as its UUID, the envelope as metadata
	// and the event JSON as payload.
	Message *message.Message
}

// Broker appends messages to the broker in order.
//
// Publish returns one error per message, nil when the broker acknowledged
// it. An error wrapping [ErrBrokerUnavailable] means the broker, not the
// message, failed. Messages of one aggregate must be appended in the order
// given: an implementation that sends them concurrently must keep one
// aggregate's messages on one ordered path.
type Broker interface {
	Publish(ctx context.Context, msgs []Outgoing) []error
}

// PayloadLimiter is implemented by a [Broker] with a hard limit on the size
// of one message (Kafka's producer MaxMessageBytes, NATS's max_payload).
// The forwarder checks each row against the smaller of that limit and
// Config.MaxPayloadBytes before sending it, so a row that cannot fit is
// parked without an attempt being spent on the broker.
type PayloadLimiter interface {
	// MaxMessageBytes is the largest message the broker accepts, counted
	// as MessageBytes counts; 0 when it has no limit (yet).
	MaxMessageBytes() int
	// MessageBytes is m's size as the broker counts it against that
	// limit: payload, metadata (headers), key and framing.
	MessageBytes(m Outgoing) int
}

// MetadataAdder is implemented by a [Broker] that adds metadata to each
// message when it publishes it (the CloudEvents attributes of
// brokers.WithCloudEvents). AddedMetadataBytes is what it adds to m, keys
// and values, so that a limit counting a message's metadata
// (outbox.Config.MaxEventBytes) counts the message as published. A
// PayloadLimiter's MessageBytes already counts it.
type MetadataAdder interface {
	AddedMetadataBytes(m Outgoing) int
}
