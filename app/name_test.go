package app_test

import (
	"errors"
	"testing"

	"github.com/outflow-dev/outflow/app"
)

func TestValidateName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"Acme", true},
		{"  Café Zoë  ", true},
		{"東京ショップ", true},
		{"שלום", true},
		{"👩\u200d💻", true}, // a zero-width joiner inside an emoji sequence
		{"A\u200bB", true}, // a zero-width space between letters
		{"e\u0301", true},  // a combining accent on a letter
		{"", false},
		{" \t ", false},
		{"Acme\u202egnp.exe", false}, // right-to-left override
		{"\u202aAcme", false},        // left-to-right embedding
		{"Acme\u2066x\u2069", false}, // isolates
		{"Acme\u200f", false},        // right-to-left mark
		{"\u200b\u200c\u200d\u2060\ufeff", false},
		{"\u3164\u115f\u1160\uffa0", false}, // Hangul fillers: letters that draw nothing
		{"\u2800\u00a0\u3000", false},       // blank braille, no-break and ideographic spaces
		{"\ufe0f\u0301", false},             // a variation selector and a lone combining mark
		{"a\x00b", false},
		{"bad \xff", false},
	} {
		err := app.ValidateName("name", tt.name, 200)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, app.ErrInvalidInput) {
			t.Errorf("ValidateName(%q): %v is not ErrInvalidInput", tt.name, err)
		}
	}
}
