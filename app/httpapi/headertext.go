package httpapi

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// validHeaderText reports whether a header value we store (Idempotency-Key,
// X-Correlation-ID) is valid UTF-8 without control characters: PostgreSQL
// refuses invalid UTF-8 in text, and encoding/json would silently replace
// it in an event's metadata.
func validHeaderText(v string) bool {
	return utf8.ValidString(v) && !strings.ContainsFunc(v, unicode.IsControl)
}
