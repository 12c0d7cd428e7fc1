package forwarder_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
)

// paymentNoted is version 2: v1 called the amount "cents".
type paymentNoted struct {
	Amount int64 `json:"amount"`
}

func (paymentNoted) EventType() string  { return "payment.noted" }
func (paymentNoted) SchemaVersion() int { return 2 }

// The message of an outbox row, the one the forwarder publishes and a
// replay publishes again, keeps the schema version its metadata column
// recorded (the envelope built from the columns has none to overwrite it
// with), so that the consumer upcasts a stored event of any age, and
// holds one newer than it knows.
func TestMessageKeepsTheRowsSchemaVersion(t *testing.T) {
	t.Parallel()
	reg := events.NewRegistry()
	require.NoError(t, reg.RegisterVersioned(paymentNoted{}, events.Upcaster{From: 1, Func: func(old json.RawMessage) (json.RawMessage, error) {
		var v1 struct {
			Cents int64 `json:"cents"`
		}
		if err := json.Unmarshal(old, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(paymentNoted{Amount: v1.Cents})
	}}))
	for _, tt := range []struct {
		name, metadata, payload, version string
		newer                            bool
	}{
		{"written before versions", `{}`, `{"cents": 700}`, "", false},
		{"v1", `{"schema_version": "1", "correlation_id": "c"}`, `{"cents": 700}`, "1", false},
		{"v2", `{"schema_version": "2"}`, `{"amount": 700}`, "2", false},
		{"v3, newer", `{"schema_version": "3"}`, `{"amount": {"value": 700}}`, "3", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := forwarder.Message(forwarder.Row{
				MessageID: "0190c0de-0000-7000-8000-000000000001", AggregateType: "payment", AggregateID: "p1", AggregateVersion: 1,
				EventType: "payment.noted", Payload: tt.payload, Metadata: tt.metadata, OccurredAt: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC),
			})
			require.NoError(t, err)
			require.Equal(t, tt.version, msg.Metadata.Get(events.SchemaVersionKey))
			ev, err := reg.DecodeMessage(msg)
			if tt.newer {
				require.True(t, errors.Is(err, events.ErrUnknownVersion), "%v", err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, paymentNoted{Amount: 700}, ev.Payload)
		})
	}
}
