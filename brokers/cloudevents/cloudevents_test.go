package cloudevents_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		cfg     cloudevents.Config
		wantErr string
	}{
		{name: "zero value: the default source", cfg: cloudevents.Config{}},
		{name: "absolute source", cfg: cloudevents.Config{Source: "https://payments.example.com/outbox"}},
		{name: "relative source", cfg: cloudevents.Config{Source: "/payments"}},
		{name: "urn source", cfg: cloudevents.Config{Source: "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66"}},
		{name: "space in source", cfg: cloudevents.Config{Source: "my service"}, wantErr: `Source "my service" is not a URI-reference: character " " at 2`},
		{name: "bad escape in source", cfg: cloudevents.Config{Source: "/a%zz"}, wantErr: `Source "/a%zz" is not a URI-reference`},
		{name: "non-ASCII source", cfg: cloudevents.Config{Source: "/caf\u00e9"}, wantErr: "percent-encode it"},
		{name: "dataschema template", cfg: cloudevents.Config{DataSchema: "https://schemas.example.com/{type}/v{version}.json"}},
		{name: "relative dataschema", cfg: cloudevents.Config{DataSchema: "/schemas/{type}"}, wantErr: "DataSchema \"/schemas/{type}\" does not give an absolute URI"},
		{name: "dataschema with a space", cfg: cloudevents.Config{DataSchema: "https://x/ {type}"}, wantErr: "DataSchema \"https://x/ {type}\" is not a URI template"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, cloudevents.ErrInvalidConfig)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestAttributes(t *testing.T) {
	t.Parallel()
	occurred := time.Date(2026, 12, 5, 3, 4, 5, 123456000, time.UTC)
	row := forwarder.Row{MessageID: "0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f", AggregateType: "payment", AggregateID: "pay-1",
		AggregateVersion: 3, EventType: "payment.paid", Payload: `{"amount": 1250}`, OccurredAt: occurred,
		Metadata: `{"schema_version":"2","correlation_id":"corr-1","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`}
	discarded := row
	at := occurred.Add(time.Hour)
	discarded.DiscardedAt = &at
	legacy := row
	legacy.Metadata = "{}" // written before schema versions, correlation and traces
	cfg := cloudevents.Config{DataSchema: "https://schemas.example.com/{type}/v{version}.json"}
	for _, tt := range []struct {
		name string
		row  forwarder.Row
		want []cloudevents.Attribute
	}{
		{name: "an event", row: row, want: []cloudevents.Attribute{
			{"id", row.MessageID}, {"source", "urn:outflow"}, {"specversion", "1.0"}, {"type", "payment.paid"},
			{"time", "2026-12-05T03:04:05.123456Z"}, {"subject", "pay-1"}, {"datacontenttype", "application/json"},
			{"dataschema", "https://schemas.example.com/payment.paid/v2.json"},
			{"aggregatetype", "payment"}, {"aggregateversion", "3"}, {"schemaversion", "2"}, {"correlationid", "corr-1"},
			{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, {"partitionkey", "pay-1"},
		}},
		{name: "a discard marker: its own type, no schema version", row: discarded, want: []cloudevents.Attribute{
			{"id", row.MessageID}, {"source", "urn:outflow"}, {"specversion", "1.0"}, {"type", events.EventTypeDiscarded},
			{"time", "2026-12-05T03:04:05.123456Z"}, {"subject", "pay-1"}, {"datacontenttype", "application/json"},
			{"dataschema", "https://schemas.example.com/outflow.discarded/v1.json"},
			{"aggregatetype", "payment"}, {"aggregateversion", "3"}, {"correlationid", "corr-1"},
			{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, {"partitionkey", "pay-1"},
		}},
		{name: "an event of before schema versions: version 1, no empty extension", row: legacy, want: []cloudevents.Attribute{
			{"id", row.MessageID}, {"source", "urn:outflow"}, {"specversion", "1.0"}, {"type", "payment.paid"},
			{"time", "2026-12-05T03:04:05.123456Z"}, {"subject", "pay-1"}, {"datacontenttype", "application/json"},
			{"dataschema", "https://schemas.example.com/payment.paid/v1.json"},
			{"aggregatetype", "payment"}, {"aggregateversion", "3"}, {"partitionkey", "pay-1"},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := forwarder.Message(tt.row)
			require.NoError(t, err)
			require.Equal(t, tt.want, cfg.Attributes(msg))
		})
	}
}

// Apply leaves the forwarder's message as it was, and AddedBytes is what
// it added to the metadata.
func TestApplyCopies(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f", []byte(`{}`))
	msg.Metadata = events.Envelope{MessageID: msg.UUID, EventType: "payment.paid", AggregateType: "payment", AggregateID: "p",
		AggregateVersion: 1, OccurredAt: time.Unix(0, 0)}.Metadata()
	before := len(msg.Metadata)
	cfg := cloudevents.Config{}
	for _, b := range []cloudevents.Binding{cloudevents.Kafka, cloudevents.NATS, cloudevents.AMQP, cloudevents.Redis} {
		out := cfg.Apply(b, msg)
		require.Len(t, msg.Metadata, before, "the original is untouched")
		added := 0
		for k, v := range out.Metadata {
			if _, ok := msg.Metadata[k]; !ok {
				require.True(t, b.IsKey(k), k)
				added += len(k) + len(v)
			}
		}
		require.Equal(t, added, cfg.AddedBytes(b, msg), b.Name)
		require.Equal(t, "1.0", out.Metadata.Get(b.Prefix+"specversion"))
		require.Equal(t, "application/json", out.Metadata.Get(b.ContentTypeKey))
	}
}

// Example shows the attributes of a forwarded event and where the Kafka
// binding puts them.
func Example() {
	msg, err := forwarder.Message(forwarder.Row{MessageID: "0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f", AggregateType: "payment",
		AggregateID: "pay-1", AggregateVersion: 1, EventType: "payment.paid", Payload: `{"amount": 1250}`,
		OccurredAt: time.Date(2026, 12, 5, 3, 4, 5, 0, time.UTC), Metadata: `{"schema_version":"1"}`})
	if err != nil {
		panic(err)
	}
	cfg := cloudevents.Config{Source: "https://payments.example.com"}
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	for _, a := range cfg.Attributes(msg) {
		fmt.Printf("%s: %s\n", cloudevents.Kafka.Key(a.Name), a.Value)
	}
	fmt.Println(errors.Is(cloudevents.Config{Source: "not a uri"}.Validate(), cloudevents.ErrInvalidConfig))
	// Output:
	// ce_id: 0193a5b0-7e1c-7cc0-8d6e-1a2b3c4d5e6f
	// ce_source: https://payments.example.com
	// ce_specversion: 1.0
	// ce_type: payment.paid
	// ce_time: 2026-12-05T03:04:05Z
	// ce_subject: pay-1
	// content-type: application/json
	// ce_aggregatetype: payment
	// ce_aggregateversion: 1
	// ce_schemaversion: 1
	// ce_partitionkey: pay-1
	// true
}
