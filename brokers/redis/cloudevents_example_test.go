package redis_test

import (
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
)

// The CloudEvents keys of a message become fields of the entry; the rest
// of the metadata stays in watermill-redisstream's msgpack field.
func ExampleCloudEventsMarshaller() {
	msg := message.NewMessage("0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f", []byte(`{"amount": 1250}`))
	msg.Metadata = message.Metadata{"event_type": "payment.paid", "ce_type": "payment.paid", "ce_specversion": "1.0", "content-type": "application/json"}
	values, err := redisstreams.CloudEventsMarshaller{}.Marshal("payments", msg)
	if err != nil {
		panic(err)
	}
	fields := make([]string, 0, len(values))
	for k := range values {
		fields = append(fields, k)
	}
	slices.Sort(fields)
	fmt.Println(fields)
	// Output:
	// [_watermill_message_uuid ce_specversion ce_type content-type metadata payload]
}
