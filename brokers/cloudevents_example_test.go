package brokers_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
)

// printBroker prints the metadata of what it is given to publish.
type printBroker struct{}

func (printBroker) Publish(_ context.Context, msgs []forwarder.Outgoing) []error {
	for _, m := range msgs {
		keys := make([]string, 0, len(m.Message.Metadata))
		for k := range m.Message.Metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Printf("%s=%s\n", k, m.Message.Metadata[k])
		}
	}
	return make([]error, len(msgs))
}

// A backend's broker publishes through WithCloudEvents with its binding:
// here Kafka's, over a broker that prints the headers it would write.
func ExampleWithCloudEvents() {
	b := brokers.WithCloudEvents(printBroker{}, cloudevents.Kafka, cloudevents.Config{Source: "/payments"})
	msg, err := forwarder.Message(forwarder.Row{MessageID: "0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f", AggregateType: "payment",
		AggregateID: "pay-1", AggregateVersion: 1, EventType: "payment.paid", Payload: `{"amount": 1250}`,
		OccurredAt: time.Date(2026, 12, 5, 3, 4, 5, 0, time.UTC)})
	if err != nil {
		panic(err)
	}
	b.Publish(context.Background(), []forwarder.Outgoing{{Topic: "payment", AggregateID: "pay-1", Message: msg}})
	// Output:
	// aggregate_id=pay-1
	// aggregate_type=payment
	// aggregate_version=1
	// ce_aggregatetype=payment
	// ce_aggregateversion=1
	// ce_id=0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f
	// ce_partitionkey=pay-1
	// ce_source=/payments
	// ce_specversion=1.0
	// ce_subject=pay-1
	// ce_time=2026-12-05T03:04:05Z
	// ce_type=payment.paid
	// content-type=application/json
	// event_type=payment.paid
	// message_id=0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f
	// occurred_at=2026-12-05T03:04:05Z
}
