package endpoints

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/outflow-dev/outflow/webhooks"
)

// Bounds of an endpoint's fields.
const (
	MaxDescriptionLen = 500   // characters
	MaxEventTypes     = 100   // entries of event_types
	MaxEventTypeLen   = 100   // bytes of one entry
	MaxRateLimit      = 10000 // requests per second
)

func invalid(field, format string, args ...any) error {
	return &webhooks.ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}

func (s *Store) validateNew(in NewEndpoint) error {
	if err := s.validateURL(in.URL); err != nil {
		return err
	}
	if err := validateDescription(in.Description); err != nil {
		return err
	}
	if err := validateEventTypes(in.EventTypes); err != nil {
		return err
	}
	return validateRateLimit(in.RateLimit)
}

func (s *Store) validateUpdate(in Update) error {
	if in.URL != nil {
		if err := s.validateURL(*in.URL); err != nil {
			return err
		}
	}
	if in.Description != nil {
		if err := validateDescription(*in.Description); err != nil {
			return err
		}
	}
	if in.EventTypes != nil {
		if err := validateEventTypes(*in.EventTypes); err != nil {
			return err
		}
	}
	if in.RateLimit != nil && in.ClearRateLimit {
		return invalid("rate_limit", "cannot be both set and cleared")
	}
	return validateRateLimit(in.RateLimit)
}

// validateURL is the check the reference app made of a merchant's webhook
// URL: no control characters, then the SSRF policy's (https, no address
// that is not public by its spelling, no credentials). Where a name leads
// is checked again at every connection.
func (s *Store) validateURL(u string) error {
	switch {
	case !utf8.ValidString(u) || strings.ContainsFunc(u, unicode.IsControl):
		return invalid("url", "must not contain control characters")
	case u == "":
		return invalid("url", "is required")
	}
	if _, err := s.policy.CheckURL(u); err != nil {
		return invalid("url", "%s", err.Error())
	}
	return nil
}

// validateDescription allows line breaks and tabs but no other control
// character: PostgreSQL refuses NUL in text, and the others only hide
// what the description says in a console.
func validateDescription(d string) error {
	if !utf8.ValidString(d) || strings.ContainsFunc(d, func(r rune) bool {
		return unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r'
	}) {
		return invalid("description", "must be UTF-8 text without control characters other than line breaks and tabs")
	}
	if n := utf8.RuneCountInString(d); n > MaxDescriptionLen {
		return invalid("description", "must be at most %d characters, not %d", MaxDescriptionLen, n)
	}
	return nil
}

// validateEventTypes accepts event type names ([a-z0-9_.-]) and prefixes
// ("payment.*": every type starting with "payment."), as fanout matches
// them, each once.
func validateEventTypes(types []string) error {
	if len(types) > MaxEventTypes {
		return invalid("event_types", "must hold at most %d types, not %d", MaxEventTypes, len(types))
	}
	seen := make(map[string]bool, len(types))
	for i, t := range types {
		if err := checkEventType(t); err != "" {
			return invalid("event_types", "[%d]: %s", i, err)
		}
		if seen[t] {
			return invalid("event_types", "[%d]: %q is given twice", i, t)
		}
		seen[t] = true
	}
	return nil
}

func checkEventType(t string) string {
	switch {
	case t == "":
		return "must not be empty (an empty list is every type)"
	case len(t) > MaxEventTypeLen:
		return fmt.Sprintf("must be at most %d bytes", MaxEventTypeLen)
	}
	name := strings.TrimSuffix(t, ".*")
	if name == "" {
		return "must name a prefix before \".*\" (an empty list is every type)"
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return "must be lowercase letters, digits, '_', '.' and '-', with an optional trailing \".*\""
		}
	}
	return ""
}

func validateRateLimit(n *int) error {
	if n != nil && (*n < 1 || *n > MaxRateLimit) {
		return invalid("rate_limit", "must be from 1 to %d requests per second, not %d", MaxRateLimit, *n)
	}
	return nil
}
