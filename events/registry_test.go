package events_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
)

// The tests use the invoice events the package example defines.
const (
	paidType     = "invoice.paid"
	canceledType = "invoice.canceled"
)

func registry(t *testing.T) *events.Registry {
	t.Helper()
	r := events.NewRegistry()
	require.NoError(t, r.Register(invoicePaid{}, invoiceCanceled{}))
	return r
}

func TestDecode(t *testing.T) {
	t.Parallel()
	r := registry(t)
	tests := []struct {
		name      string
		eventType string
		data      string
		want      events.Payload
		unknown   bool
		malformed bool
	}{
		{"paid", paidType, `{"invoice_id":"i","customer_id":"c","amount":10,"currency":"EUR","paid_at":"2026-12-02T10:00:00Z"}`,
			invoicePaid{InvoiceID: "i", CustomerID: "c", Amount: 10, Currency: "EUR", PaidAt: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}, false, false},
		{"unknown fields are ignored", canceledType, `{"invoice_id":"i","customer_id":"c","amount":1,"currency":"EUR","new_field":true}`,
			invoiceCanceled{InvoiceID: "i", CustomerID: "c", Amount: 1, Currency: "EUR"}, false, false},
		{"unknown type", "invoice.exploded", `{}`, nil, true, false},
		{"empty type", "", `{}`, nil, true, false},
		{"not JSON", paidType, `{"invoice_id":`, nil, false, true},
		{"wrong type", paidType, `{"invoice_id":"i","customer_id":"c","amount":"10","currency":"EUR"}`, nil, false, true},
		{"fails validation", paidType, `{"invoice_id":"i","customer_id":"c","amount":0,"currency":"EUR"}`, nil, false, true},
		{"trailing data", paidType, `{"invoice_id":"i","customer_id":"c","amount":1,"currency":"EUR"} {}`, nil, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Decode(tt.eventType, []byte(tt.data))
			var ute *events.UnknownTypeError
			var mpe *events.MalformedPayloadError
			switch {
			case tt.unknown:
				require.ErrorAs(t, err, &ute)
				require.Equal(t, tt.eventType, ute.EventType)
			case tt.malformed:
				require.ErrorAs(t, err, &mpe)
				require.Equal(t, tt.eventType, mpe.EventType)
				require.Contains(t, err.Error(), tt.eventType)
			default:
				require.NoError(t, err)
				require.Equal(t, tt.want, got)
			}
		})
	}
}

func TestRegisterConflicts(t *testing.T) {
	t.Parallel()
	r := registry(t)
	require.NoError(t, r.Register(invoicePaid{}, invoiceCanceled{}), "registering the same types again is fine")
	require.Error(t, r.Register(other{}), "another Go type under a taken event type")
	require.Error(t, r.Register(&invoicePaid{}), "pointers are refused")
}

type other struct{}

func (other) EventType() string { return paidType }

func TestMessageRoundTrip(t *testing.T) {
	t.Parallel()
	r := registry(t)
	ctx := events.WithCorrelationID(context.Background(), "c-1")
	ev, err := events.New(ctx, events.Aggregate{Type: invoiceAggregate, ID: "i-1", Version: 3},
		invoicePaid{InvoiceID: "i-1", CustomerID: "c", Amount: 5, Currency: "USD", PaidAt: time.Now().UTC().Truncate(time.Second)})
	require.NoError(t, err)
	msg, err := ev.Message(ctx)
	require.NoError(t, err)
	require.Equal(t, ev.MessageID, msg.UUID)

	got, err := r.DecodeMessage(msg)
	require.NoError(t, err)
	require.Equal(t, ev.Envelope.MessageID, got.MessageID)
	require.Equal(t, int64(3), got.AggregateVersion)
	require.Equal(t, "c-1", got.CorrelationID)
	require.True(t, ev.OccurredAt.Equal(got.OccurredAt))
	require.Equal(t, ev.Payload, got.Payload)
}

func TestEnvelopeFromMessageNamesBadField(t *testing.T) {
	t.Parallel()
	ev, err := events.New(context.Background(), events.Aggregate{Type: invoiceAggregate, ID: "i", Version: 1},
		invoiceCanceled{InvoiceID: "i", CustomerID: "c", Amount: 1, Currency: "EUR"})
	require.NoError(t, err)
	for key, bad := range map[string]string{
		events.AggregateVersionKey: "two",
		events.OccurredAtKey:       "yesterday",
		events.AggregateIDKey:      "",
		events.EventTypeKey:        "",
		events.TraceparentKey:      "not-a-traceparent",
	} {
		msg, err := ev.Message(context.Background())
		require.NoError(t, err)
		msg.Metadata[key] = bad
		_, err = events.EnvelopeFromMessage(msg)
		var ee *events.EnvelopeError
		require.True(t, errors.As(err, &ee), "%s: %v", key, err)
		require.Equal(t, key, ee.Field)
	}
}

// GoType and Types answer what a consumer checks its handlers against.
func TestRegistryLookups(t *testing.T) {
	t.Parallel()
	r := registry(t)
	got, ok := r.GoType(paidType)
	require.True(t, ok)
	require.Equal(t, reflect.TypeFor[invoicePaid](), got)
	_, ok = r.GoType("invoice.piad")
	require.False(t, ok)
	require.Equal(t, []string{canceledType, paidType}, r.Types())
}
