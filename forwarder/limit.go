package forwarder

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrTooLarge marks a row that does not fit the effective payload limit:
// the smaller of Config.MaxPayloadBytes and the broker's own limit on one
// message ([PayloadLimiter]).
var ErrTooLarge = errors.New("message too large")

// brokerLimit is the broker's limit for this batch, nil when it has none.
type brokerLimit struct {
	l   PayloadLimiter
	max int
}

func (f *Forwarder) brokerLimit() *brokerLimit {
	l, ok := f.cfg.Broker.(PayloadLimiter)
	if !ok {
		return nil
	}
	m := l.MaxMessageBytes()
	if m <= 0 {
		return nil
	}
	return &brokerLimit{l: l, max: m}
}

// checkSize fails a row whose payload exceeds MaxPayloadBytes, or whose
// message, as the broker counts it, exceeds the broker's limit. The error
// names both limits and the one that applied. It measures the message's
// payload, not the row's: a discarded row's marker carries an empty one.
func (f *Forwarder) checkSize(lim *brokerLimit, m Outgoing) error {
	payload := len(m.Message.Payload)
	if lim == nil {
		if payload > f.cfg.MaxPayloadBytes {
			return fmt.Errorf("%w: payload of %d bytes exceeds MaxPayloadBytes %d (the broker has no limit of its own)",
				ErrTooLarge, payload, f.cfg.MaxPayloadBytes)
		}
		return nil
	}
	if payload > f.cfg.MaxPayloadBytes {
		return fmt.Errorf("%w: payload of %d bytes exceeds MaxPayloadBytes %d, which applied (the broker's limit is %d bytes per message with metadata and key)",
			ErrTooLarge, payload, f.cfg.MaxPayloadBytes, lim.max)
	}
	if size := lim.l.MessageBytes(m); size > lim.max {
		return fmt.Errorf("%w: payload of %d bytes is a message of %d bytes with metadata and key, over the broker's limit of %d bytes, which applied (MaxPayloadBytes is %d)",
			ErrTooLarge, payload, size, lim.max, f.cfg.MaxPayloadBytes)
	}
	return nil
}

// maxErrorBytes bounds last_error.
const maxErrorBytes = 2000

// truncate cuts s to at most n bytes of valid UTF-8 without NUL bytes, the
// text PostgreSQL accepts: a mark that PostgreSQL refused would fail the
// whole batch after its publish, every time. A cut never splits a
// character.
func truncate(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
