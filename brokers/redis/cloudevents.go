package redis

import (
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/brokers/cloudevents"
)

// CloudEventsMarshaller writes an entry as watermill-redisstream's
// marshaller does, except that the metadata keys of the CloudEvents Redis
// binding ([cloudevents.Redis]: ce_<attribute>, content-type) become fields
// of the entry of their own, beside payload, metadata and
// _watermill_message_uuid, instead of staying inside the msgpack-encoded
// metadata field: a reader in another stack reads them with XREAD (one
// HGETALL-like map per entry) and no msgpack. Outflow's subscriber reads
// the envelope from the metadata field, as before, and ignores them.
type CloudEventsMarshaller struct {
	// Inner encodes the rest. Defaults to watermill-redisstream's.
	Inner redisstream.Marshaller
}

// Marshal implements [redisstream.Marshaller].
func (c CloudEventsMarshaller) Marshal(topic string, msg *message.Message) (map[string]any, error) {
	inner := c.Inner
	if inner == nil {
		inner = redisstream.DefaultMarshallerUnmarshaller{}
	}
	rest := message.NewMessage(msg.UUID, msg.Payload)
	rest.Metadata = make(message.Metadata, len(msg.Metadata))
	fields := map[string]any{}
	for k, v := range msg.Metadata {
		if cloudevents.Redis.IsKey(k) {
			fields[k] = v
		} else {
			rest.Metadata[k] = v
		}
	}
	values, err := inner.Marshal(topic, rest)
	if err != nil {
		return nil, err
	}
	for k, v := range fields {
		values[k] = v
	}
	return values, nil
}
