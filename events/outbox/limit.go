package outbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
)

// DefaultMaxEventBytes is Config.MaxEventBytes when it is 0: 1 MiB, the
// forwarder's default MaxPayloadBytes and the default limit of a NATS
// server (max_payload) and of the Kafka producer (MaxMessageBytes).
const DefaultMaxEventBytes = 1 << 20

// ErrEventTooLarge is returned, wrapped in an [*EventTooLargeError], for an
// event larger than the writer's limit. Nothing of the call was written:
// the transaction is as it was, so the caller can roll back or write a
// smaller event (a body by reference) and commit.
var ErrEventTooLarge = errors.New("outbox: event too large")

// EventTooLargeError names the event that did not fit, its size and the
// limit that applied. errors.Is(err, [ErrEventTooLarge]) holds for it.
type EventTooLargeError struct {
	MessageID     string
	EventType     string
	AggregateType string
	AggregateID   string
	// Size is the event's size as the limit that applied counts it.
	Size int
	// Limit is the limit that applied.
	Limit int
	// Broker is true when the broker's own limit applied (Config.Broker),
	// counted as the broker counts a message: with its headers, key and
	// framing. False: Config.MaxEventBytes applied, counting the payload
	// and the metadata's keys and values.
	Broker bool
	// ByReference is true when the payload was to go by reference
	// (Config.ClaimCheck) and ClaimCheck.MaxBodyBytes applied to it.
	ByReference bool
}

func (e *EventTooLargeError) Error() string {
	what := fmt.Sprintf("%s event of %s %s (message %s)", e.EventType, e.AggregateType, e.AggregateID, e.MessageID)
	if e.ByReference {
		return fmt.Sprintf("%s: %s has a payload of %d bytes to go by reference, over ClaimCheck.MaxBodyBytes %d",
			ErrEventTooLarge, what, e.Size, e.Limit)
	}
	if e.Broker {
		return fmt.Sprintf("%s: %s is a message of %d bytes as the broker counts it (payload, headers, key, framing), over the broker's limit of %d bytes",
			ErrEventTooLarge, what, e.Size, e.Limit)
	}
	return fmt.Sprintf("%s: %s is %d bytes (payload and metadata), over MaxEventBytes %d",
		ErrEventTooLarge, what, e.Size, e.Limit)
}

// Unwrap makes errors.Is(err, ErrEventTooLarge) hold.
func (e *EventTooLargeError) Unwrap() error { return ErrEventTooLarge }

// brokerMax is the broker's limit on one message, 0 when it has none (or
// no Broker was configured).
func (w *Writer) brokerMax() int {
	if w.broker == nil {
		return 0
	}
	return max(w.broker.MaxMessageBytes(), 0)
}

// checkSize fails ev, whose message msg the writer built and which goes to
// topic, when the message the forwarder (or the WAL relay) will publish
// for it does not fit the writer's limit or the broker's. That message is
// built as the forwarder builds it ([forwarder.Message]) from what the
// writer stores: in ModeTable the payload comes back from the jsonb column
// in PostgreSQL's text form (", " and ": " between members, Unicode
// unescaped, numbers in plain notation), in ModeWAL it stays compact.
func (w *Writer) checkSize(ev events.Event, msg *message.Message, topic string) error {
	bmax := w.brokerMax()
	if w.maxEventBytes <= 0 && bmax == 0 {
		return nil
	}
	payloadLen := len(msg.Payload)
	if w.mode == ModeTable {
		payloadLen = jsonbTextLen(msg.Payload)
	}
	env := ev.Envelope
	tooLarge := func(size, limit int, broker bool) error {
		return &EventTooLargeError{MessageID: env.MessageID, EventType: env.EventType, AggregateType: env.AggregateType,
			AggregateID: env.AggregateID, Size: size, Limit: limit, Broker: broker}
	}
	// The forwarder's metadata is the message's: ev.Message wrote it from
	// this envelope (its schema version included). The occurred_at is the
	// writer's, which is at least as long as the microsecond one
	// PostgreSQL keeps: the count errs by a few bytes at most, and on the
	// side of caution.
	md := msg.Metadata
	size := payloadLen
	for k, v := range md {
		size += len(k) + len(v)
	}
	if a, ok := w.broker.(forwarder.MetadataAdder); ok {
		// What the broker adds at publish (the CloudEvents attributes,
		// derived from this envelope): the message as published counts.
		size += a.AddedMetadataBytes(forwarder.Outgoing{Topic: topic, AggregateID: env.AggregateID, Message: msg})
	}
	if w.maxEventBytes > 0 && size > w.maxEventBytes {
		return tooLarge(size, w.maxEventBytes, false)
	}
	if bmax == 0 {
		return nil
	}
	// The broker counts its own way (headers, key, framing) on the
	// message itself; its content does not matter, its length does, so
	// the payload is the writer's padded to the forwarded length.
	payload := msg.Payload
	if n := payloadLen - len(payload); n > 0 {
		payload = append(append(make([]byte, 0, payloadLen), payload...), strings.Repeat(" ", n)...)
	}
	fm := message.NewMessage(msg.UUID, payload)
	fm.Metadata = md
	if bsize := w.broker.MessageBytes(forwarder.Outgoing{Topic: topic, AggregateID: env.AggregateID, Message: fm}); bsize > bmax {
		return tooLarge(bsize, bmax, true)
	}
	return nil
}

// jsonbTextLen is the length of the text PostgreSQL gives back for the
// JSON text b once stored as jsonb (payload::text, what the forwarder
// reads and publishes): whitespace dropped, ", " between elements and
// members, ": " after keys, strings with their escapes decoded and
// re-escaped as jsonb does (only '"', '\\' and control characters), and
// numbers as numeric prints them (1e3 is 1000). Duplicate keys, which
// jsonb keeps once, are counted each time, so the length errs only long.
// b must be valid JSON, as json.Marshal gives it.
func jsonbTextLen(b []byte) int {
	n := 0
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			l, next := jsonbStringLen(b, i)
			n += l
			i = next
		case c == ',' || c == ':':
			n += 2
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '-' || (c >= '0' && c <= '9'):
			j := i + 1
			for j < len(b) && strings.IndexByte("0123456789.eE+-", b[j]) >= 0 {
				j++
			}
			n += numericLen(string(b[i:j]))
			i = j
		default: // { } [ ] and the letters of true, false, null
			n++
			i++
		}
	}
	return n
}

// jsonbStringLen measures the JSON string starting at b[i] (its opening
// quote) as jsonb prints it, and returns the index after its closing quote.
func jsonbStringLen(b []byte, i int) (int, int) {
	n := 2 // the quotes
	i++
	for i < len(b) && b[i] != '"' {
		if b[i] != '\\' {
			n++ // raw bytes, UTF-8 included, are printed as they are
			i++
			continue
		}
		if i+1 >= len(b) {
			return n, len(b)
		}
		esc := b[i+1]
		i += 2
		switch esc {
		case '/':
			n++
			continue
		case 'u':
		default: // \" \\ \b \f \n \r \t stay two bytes
			n += 2
			continue
		}
		r, next := hex4(b, i)
		i = next
		if utf16.IsSurrogate(r) && i+6 <= len(b) && b[i] == '\\' && b[i+1] == 'u' {
			if r2, next2 := hex4(b, i+2); utf16.DecodeRune(r, r2) != utf8.RuneError {
				r, i = utf16.DecodeRune(r, r2), next2
			}
		}
		n += escapedRuneLen(r)
	}
	return n, i + 1
}

func hex4(b []byte, i int) (rune, int) {
	var r rune
	end := min(i+4, len(b))
	for _, c := range b[i:end] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		}
	}
	return r, end
}

// escapedRuneLen is r's length in jsonb's output (escape_json).
func escapedRuneLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6 // \u00XX
	case utf16.IsSurrogate(r):
		return 3 // a lone surrogate: PostgreSQL refuses it anyway
	}
	return utf8.RuneLen(r)
}

// numericLen is the length of numeric's output for the JSON number s:
// the digits of the value with its decimal scale (the digits after the
// point, less the exponent), a sign unless it is zero.
func numericLen(s string) int {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, 0
	if k := strings.IndexAny(s, "eE"); k >= 0 {
		mant = s[:k]
		e := s[k+1:]
		sign := 1
		if e != "" && (e[0] == '+' || e[0] == '-') {
			if e[0] == '-' {
				sign = -1
			}
			e = e[1:]
		}
		for _, c := range e {
			exp = exp*10 + int(c-'0')
			if exp > 1<<20 { // numeric refuses it: the INSERT fails anyway
				break
			}
		}
		exp *= sign
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	scale := max(len(frac)-exp, 0)
	point := len(intPart) + exp // digits[:point] is the integer part
	var intDigits int
	switch {
	case point <= 0:
		intDigits = 0
	case point >= len(digits):
		intDigits = len(strings.TrimLeft(digits, "0"))
		if intDigits > 0 {
			intDigits += point - len(digits)
		}
	default:
		intDigits = len(strings.TrimLeft(digits[:point], "0"))
	}
	n := max(intDigits, 1) + scale
	if scale > 0 {
		n++ // the point
	}
	if neg && strings.Trim(digits, "0") != "" {
		n++
	}
	return n
}
