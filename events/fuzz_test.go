package events_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/events"
)

// The envelope of any message a broker hands over: reading it never
// panics, and what is accepted is valid and survives a round trip through
// the metadata the forwarder writes.
func FuzzEnvelopeFromMessage(f *testing.F) {
	f.Add("0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60", "", "payment.paid", "payment", "p-1", "1", "2026-12-02T10:00:00Z", "corr", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("", "0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60", "t", "a", "i", "9223372036854775807", "2026-12-02T10:00:00.123456789+05:30", "", "")
	f.Add("urn:uuid:0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60", "", "t", "a", "i", "0", "0000-01-01T00:00:00Z", "", "")
	f.Add("{0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60}", "", "t", "a", "i", "-1", "9999-12-31T23:59:59.999999999-23:59", "c", "zz")
	f.Add("x", "", "", "", "", "1e3", "yesterday", "", "")
	f.Fuzz(func(t *testing.T, uuid, mdID, typ, aggType, aggID, version, occurred, corr, tp string) {
		msg := message.NewMessage(uuid, nil)
		for k, v := range map[string]string{
			events.MessageIDKey: mdID, events.EventTypeKey: typ, events.AggregateTypeKey: aggType, events.AggregateIDKey: aggID,
			events.AggregateVersionKey: version, events.OccurredAtKey: occurred, events.CorrelationIDKey: corr, events.TraceparentKey: tp,
		} {
			if v != "" {
				msg.Metadata.Set(k, v)
			}
		}
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			return
		}
		if err := env.Validate(); err != nil {
			t.Fatalf("accepted an invalid envelope %+v: %v", env, err)
		}
		again := message.NewMessage(env.MessageID, nil)
		again.Metadata = env.Metadata()
		back, err := events.EnvelopeFromMessage(again)
		if err != nil {
			t.Fatalf("the envelope %+v does not read back: %v", env, err)
		}
		if !reflect.DeepEqual(env, back) {
			t.Fatalf("round trip changed %+v into %+v", env, back)
		}
	})
}

// A payload from the broker: decoding never panics, and what is accepted
// was one valid JSON value (not a value followed by a stray '}' or ']'),
// passes its type's validation and re-encodes to the same payload.
func FuzzRegistryDecodeMessage(f *testing.F) {
	r := events.NewRegistry()
	if err := r.Register(invoicePaid{}, invoiceCanceled{}); err != nil {
		f.Fatal(err)
	}
	for _, seed := range []struct{ typ, data string }{
		{"invoice.paid", `{"invoice_id":"i","customer_id":"c","amount":10,"currency":"EUR","paid_at":"2026-12-02T10:00:00Z"}]`},
		{"invoice.paid", `{"invoice_id":"i","customer_id":"c","amount":10,"currency":"EUR","paid_at":"2026-12-02T10:00:00Z"}}`},
		{"invoice.paid", `{"amount":-1}`},
		{"invoice.paid", `{"invoice_id":"i","customer_id":"c","amount":10,"currency":"EUR","paid_at":"2026-12-02T10:00:00Z"}`},
		{"invoice.canceled", `{"invoice_id":"i","customer_id":"c","amount":1,"currency":"EUR"} x`},
		{"nope", `{}`},
	} {
		f.Add(seed.typ, []byte(seed.data))
	}
	f.Fuzz(func(t *testing.T, typ string, data []byte) {
		msg := message.NewMessage("0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60", data)
		msg.Metadata = events.Envelope{MessageID: msg.UUID, EventType: typ, AggregateType: "a", AggregateID: "i",
			AggregateVersion: 1, OccurredAt: mustTime(t)}.Metadata()
		ev, err := r.DecodeMessage(msg)
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted a payload that is not one JSON value: %q", data)
		}
		if v, ok := ev.Payload.(events.Validator); ok {
			if err := v.Validate(); err != nil {
				t.Fatalf("accepted an invalid payload: %v", err)
			}
		}
		enc, err := json.Marshal(ev.Payload)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := r.Decode(typ, enc)
		if err != nil {
			t.Fatalf("the re-encoded %s does not decode: %v", enc, err)
		}
		if !reflect.DeepEqual(ev.Payload, back) {
			t.Fatalf("round trip changed %#v into %#v", ev.Payload, back)
		}
	})
}

func mustTime(t *testing.T) time.Time {
	t.Helper()
	return time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
}
