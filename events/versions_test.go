package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
)

// upcaster returns an upcaster from version from that records its call in
// calls, so that a test sees the order the chain ran in.
func upcaster(from int, calls *[]int) events.Upcaster {
	return events.Upcaster{From: from, Func: func(m json.RawMessage) (json.RawMessage, error) {
		*calls = append(*calls, from)
		return m, nil
	}}
}

// A chain must take every stored version to the Go type's: checked at
// registration, in any order given.
func TestRegisterVersionedChain(t *testing.T) {
	t.Parallel()
	var calls []int
	for _, tt := range []struct {
		name    string
		ups     []events.Upcaster
		wantErr []string
	}{
		{"complete", []events.Upcaster{upcaster(1, &calls), upcaster(2, &calls)}, nil},
		{"any order", []events.Upcaster{upcaster(2, &calls), upcaster(1, &calls)}, nil},
		{"gap", []events.Upcaster{upcaster(2, &calls)}, []string{`"refund.issued"`, "no upcaster from version 1 to 2"}},
		{"none", nil, []string{"no upcaster from version 1 to 2", "no upcaster from version 2 to 3"}},
		{"duplicate", []events.Upcaster{upcaster(1, &calls), upcaster(2, &calls), upcaster(1, &calls)},
			[]string{"upcaster from version 1: registered twice"}},
		{"from the current version", []events.Upcaster{upcaster(1, &calls), upcaster(2, &calls), upcaster(3, &calls)},
			[]string{"upcaster from version 3: outside 1 to 2"}},
		{"from zero", []events.Upcaster{upcaster(0, &calls), upcaster(1, &calls), upcaster(2, &calls)},
			[]string{"upcaster from version 0: outside 1 to 2"}},
		{"nil func", []events.Upcaster{{From: 1}, upcaster(2, &calls)}, []string{"upcaster from version 1: nil Func"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := events.NewRegistry()
			err := r.RegisterVersioned(refundIssued{}, tt.ups...)
			if tt.wantErr == nil {
				require.NoError(t, err)
				v, ok := r.SchemaVersion("refund.issued")
				require.True(t, ok)
				require.Equal(t, 3, v)
				return
			}
			require.Error(t, err)
			for _, want := range tt.wantErr {
				require.ErrorContains(t, err, want)
			}
			_, ok := r.GoType("refund.issued")
			require.False(t, ok, "a broken chain registers nothing")
		})
	}
}

// The chain runs from the payload's version up, one step at a time, in
// version order whatever the order of registration.
func TestUpcastOrder(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		from int
		want []int
	}{{1, []int{1, 2}}, {2, []int{2}}, {3, nil}} {
		var calls []int
		r := events.NewRegistry()
		require.NoError(t, r.RegisterVersioned(refundIssued{}, upcaster(2, &calls), upcaster(1, &calls)))
		_, err := r.DecodeVersion("refund.issued", tt.from, []byte(`{"refund_id":"r","amount":{"value":1,"currency":"EUR"}}`))
		require.NoError(t, err)
		require.Equal(t, tt.want, calls, "from version %d", tt.from)
	}
}

// A versioned type needs its chain; the same type again is a no-op; a
// version below 1 is refused.
func TestRegisterVersionedType(t *testing.T) {
	t.Parallel()
	r := events.NewRegistry()
	require.ErrorContains(t, r.Register(refundIssued{}), "no upcaster from version 1 to 2")
	require.NoError(t, r.RegisterVersioned(refundIssued{}, refundUpcasters...))
	require.NoError(t, r.Register(refundIssued{}), "registering the same type again is not an error")
	require.ErrorContains(t, r.RegisterVersioned(refundIssued{}, refundUpcasters...), "already registered")
	require.ErrorContains(t, events.NewRegistry().Register(badVersion{}), "schema version 0, must be 1 or more")
}

type badVersion struct{}

func (badVersion) EventType() string  { return "bad.version" }
func (badVersion) SchemaVersion() int { return 0 }

func refundMessage(t *testing.T, version string, payload string) *message.Message {
	t.Helper()
	msg := message.NewMessage("0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60", []byte(payload))
	msg.Metadata = events.Envelope{MessageID: msg.UUID, EventType: "refund.issued", AggregateType: "refund", AggregateID: "r",
		AggregateVersion: 1, OccurredAt: mustTime(t)}.Metadata()
	if version != "" {
		msg.Metadata.Set(events.SchemaVersionKey, version)
	}
	return msg
}

// Every stored version decodes into the newest Go type; a newer one is
// ErrUnknownVersion and not decoded; a version that is none is malformed.
func TestDecodeMessageVersions(t *testing.T) {
	t.Parallel()
	r := events.NewRegistry()
	require.NoError(t, r.RegisterVersioned(refundIssued{}, refundUpcasters...))
	eur := refundIssued{RefundID: "r", Amount: money{Value: 1250, Currency: "EUR"}}
	for _, tt := range []struct {
		name, version, payload string
		want                   events.Payload
		newer                  bool
		errText                string
	}{
		{"no version is version 1", "", `{"refund_id":"r","amount":1250}`, eur, false, ""},
		{"v1", "1", `{"refund_id":"r","amount":1250}`, eur, false, ""},
		{"v2", "2", `{"refund_id":"r","amount":1250,"currency":"EUR"}`, eur, false, ""},
		{"v3", "3", `{"refund_id":"r","amount":{"value":1250,"currency":"EUR"}}`, eur, false, ""},
		{"v4 is newer", "4", `{"refund_id":"r","amount":{"value":1250,"currency":"EUR"},"reason":"x"}`, nil, true,
			`decode event "refund.issued": schema version 4 is newer than version 3`},
		{"v3 data read as v1", "1", `{"refund_id":"r","amount":{"value":1250,"currency":"EUR"}}`, nil, false,
			`upcast from version 2 to 3`},
		{"not a version", "two", `{}`, nil, false, `schema_version "two" is not a positive integer`},
		{"version 0", "0", `{}`, nil, false, `schema_version "0" is not a positive integer`},
		{"trailing data before an upcaster", "1", `{"refund_id":"r","amount":1250}]`, nil, false, "version 1: not one JSON value"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := r.DecodeMessage(refundMessage(t, tt.version, tt.payload))
			if tt.want != nil {
				require.NoError(t, err)
				require.Equal(t, tt.want, ev.Payload)
				return
			}
			require.ErrorContains(t, err, tt.errText)
			require.Equal(t, tt.newer, errors.Is(err, events.ErrUnknownVersion))
			var ve *events.VersionError
			if tt.newer {
				require.ErrorAs(t, err, &ve)
				require.Equal(t, 4, ve.Version)
				require.Equal(t, 3, ve.Known)
			}
		})
	}
}

// What is written carries its payload's version, also when the Event was
// built by hand; an envelope saying another version is refused; and the
// version read back is the one written.
func TestMessageCarriesSchemaVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ev, err := events.New(ctx, events.Aggregate{Type: "refund", ID: "r", Version: 1}, refundIssued{RefundID: "r", Amount: money{1, "EUR"}})
	require.NoError(t, err)
	require.Equal(t, 3, ev.SchemaVersion)

	ev.SchemaVersion = 0
	msg, err := ev.Message(ctx)
	require.NoError(t, err)
	require.Equal(t, "3", msg.Metadata.Get(events.SchemaVersionKey))
	env, err := events.EnvelopeFromMessage(msg)
	require.NoError(t, err)
	require.Equal(t, 3, env.SchemaVersion)

	ev.SchemaVersion = 2
	_, err = ev.Message(ctx)
	require.ErrorContains(t, err, "schema_version: 2 does not match the payload's version 3")

	// An unversioned payload is version 1, written without the key (its
	// bytes in every event's outbox row for nothing) and read as 1.
	paid, err := events.New(ctx, events.Aggregate{Type: "invoice", ID: "i", Version: 1}, invoiceCanceled{InvoiceID: "i", CustomerID: "c", Amount: 1, Currency: "EUR"})
	require.NoError(t, err)
	msg, err = paid.Message(ctx)
	require.NoError(t, err)
	require.NotContains(t, msg.Metadata, events.SchemaVersionKey)
	env, err = events.EnvelopeFromMessage(msg)
	require.NoError(t, err)
	require.Equal(t, 1, env.SchemaVersion)
}

// strictInvoice reads its payloads strictly.
type strictInvoice struct {
	InvoiceID string `json:"invoice_id"`
	Lines     []struct {
		Amount int64 `json:"amount"`
	} `json:"lines"`
}

func (strictInvoice) EventType() string    { return "invoice.strict" }
func (strictInvoice) StrictDecoding() bool { return true }

// A strict type's unknown field or type mismatch is an error naming the
// event type and the field; a lenient type ignores the unknown field (the
// default) but names the field of a mismatch too.
func TestStrictDecoding(t *testing.T) {
	t.Parallel()
	r := registry(t)
	require.NoError(t, r.Register(strictInvoice{}))
	for _, tt := range []struct {
		name, eventType, data string
		field                 string // "" when it decodes
	}{
		{"strict, known fields", "invoice.strict", `{"invoice_id":"i","lines":[{"amount":1}]}`, ""},
		{"strict, unknown field", "invoice.strict", `{"invoice_id":"i","refund_kind":"partial"}`, "refund_kind"},
		{"strict, unknown nested field", "invoice.strict", `{"invoice_id":"i","lines":[{"amount":1,"tax":2}]}`, "tax"},
		{"strict, type mismatch", "invoice.strict", `{"invoice_id":"i","lines":[{"amount":"1"}]}`, "lines.amount"},
		{"lenient, unknown field", canceledType, `{"invoice_id":"i","customer_id":"c","amount":1,"currency":"EUR","refund_kind":"x"}`, ""},
		{"lenient, type mismatch", canceledType, `{"invoice_id":"i","customer_id":"c","amount":"1","currency":"EUR"}`, "amount"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.Decode(tt.eventType, []byte(tt.data))
			if tt.field == "" {
				require.NoError(t, err)
				return
			}
			var mpe *events.MalformedPayloadError
			require.ErrorAs(t, err, &mpe)
			require.Equal(t, tt.eventType, mpe.EventType)
			require.Equal(t, tt.field, mpe.Field)
			require.ErrorContains(t, err, `decode event "`+tt.eventType+`"`)
			require.ErrorContains(t, err, `field "`+tt.field+`"`)
		})
	}
}

// Upcast returns the payload at the Go type's version without decoding it:
// what package schemacheck inspects for fields an upcaster left behind.
func TestUpcastReturnsTheNewestShape(t *testing.T) {
	t.Parallel()
	r := events.NewRegistry()
	require.NoError(t, r.RegisterVersioned(refundIssued{}, refundUpcasters...))
	got, err := r.Upcast("refund.issued", 1, []byte(`{"refund_id":"r1","amount":1250}`))
	require.NoError(t, err)
	require.JSONEq(t, `{"refund_id":"r1","amount":{"value":1250,"currency":"EUR"}}`, string(got))
	current := `{"refund_id":"r1","amount":{"value":1,"currency":"USD"},"extra":true}`
	got, err = r.Upcast("refund.issued", 0, []byte(current))
	require.NoError(t, err)
	require.Equal(t, current, string(got), "a payload at the current version is returned as is")

	_, err = r.Upcast("refund.issued", 4, []byte(`{}`))
	require.ErrorIs(t, err, events.ErrUnknownVersion)
	var unknown *events.UnknownTypeError
	_, err = r.Upcast("refund.lost", 1, []byte(`{}`))
	require.ErrorAs(t, err, &unknown)
	var malformed *events.MalformedPayloadError
	_, err = r.Upcast("refund.issued", 1, []byte(`{"refund_id":`))
	require.ErrorAs(t, err, &malformed)
}

type validated struct {
	N int `json:"n"`
}

var errNotPositive = errors.New("n must be positive")

func (validated) EventType() string { return "validated" }
func (v validated) Validate() error {
	if v.N <= 0 {
		return errNotPositive
	}
	return nil
}

// A Validate failure reads as before, and tells itself apart from a
// payload that did not decode.
func TestValidateFailureIsAValidationError(t *testing.T) {
	t.Parallel()
	r := events.NewRegistry()
	require.NoError(t, r.Register(validated{}))
	_, err := r.Decode("validated", []byte(`{"n":0}`))
	var invalid *events.ValidationError
	require.ErrorAs(t, err, &invalid)
	require.ErrorIs(t, err, errNotPositive)
	require.EqualError(t, err, `decode event "validated": malformed payload: n must be positive`)
	_, err = r.Decode("validated", []byte(`{"n":"x"}`))
	require.False(t, errors.As(err, &invalid), "a type mismatch is no validation error: %v", err)
}
