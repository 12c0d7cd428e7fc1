package app

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ValidateName checks a name a person gives (a merchant's, an API key's)
// and names field when it is wrong: required, at most max characters once
// trimmed, no control characters, no bidirectional formatting characters
// (overrides and isolates such as U+202E reorder what a reader sees: a
// name shown in a dashboard or an e-mail must read as it is stored), and at
// least one visible character: a name of spaces and zero-width characters
// looks empty, or like another merchant's.
func ValidateName(field, name string, max int) error {
	name = strings.TrimSpace(name)
	switch {
	case name == "":
		return &ValidationError{Field: field, Message: "is required"}
	case !utf8.ValidString(name):
		return &ValidationError{Field: field, Message: "must be valid UTF-8"}
	case utf8.RuneCountInString(name) > max:
		return &ValidationError{Field: field, Message: fmt.Sprintf("must be at most %d characters", max)}
	case strings.ContainsFunc(name, unicode.IsControl):
		return &ValidationError{Field: field, Message: "must not contain control characters"}
	case strings.ContainsFunc(name, isBidiControl):
		return &ValidationError{Field: field, Message: "must not contain bidirectional formatting characters (such as U+202E)"}
	case !strings.ContainsFunc(name, visible):
		return &ValidationError{Field: field, Message: "must contain a visible character, not only spaces or zero-width characters"}
	}
	return nil
}

// isBidiControl reports the characters Unicode calls Bidi_Control: the
// embeddings, overrides and isolates, and the marks.
func isBidiControl(r rune) bool { return unicode.Is(unicode.Bidi_Control, r) }

// visible reports whether r draws something: a letter, mark, number,
// punctuation or symbol that is not one of the default-ignorable
// characters (zero-width spaces and joiners, fillers such as U+3164, the
// variation selectors) nor the blank braille pattern.
func visible(r rune) bool {
	switch {
	case !unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S):
		return false // spaces, separators, format characters, lone marks
	case unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector):
		return false
	case r == '\u2800':
		return false
	}
	return true
}
