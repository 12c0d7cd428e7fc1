package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxDepth bounds the nesting of a request body: ours are flat objects, and
// the check below walks the body recursively.
const maxDepth = 32

// Error is why [Check] refuses a body that encoding/json would
// accept: Code is the API error code, Field the key at fault, if any.
type Error struct {
	Code    string
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Check refuses what encoding/json accepts silently and another
// parser (a proxy, a WAF, the client's logger) may read differently:
//
//   - invalid UTF-8, which encoding/json replaces with U+FFFD, and \u escapes
//     of lone surrogates, which it replaces likewise;
//   - a key given twice in one object, compared as encoding/json matches
//     keys to fields, case-insensitively ("amount" and "AMOUNT" are one
//     field, and the last one wins);
//   - a key that matches a field of dst only case-insensitively: encoding/json
//     fills "amount" from "AMOUNT", which a proxy checking "amount" misses;
//   - nesting deeper than 32.
//
// dst is the value the body is then decoded into; its struct fields give
// the keys that are exact. A body that is not JSON at all is left to the
// decoder, which reports it better: Check returns nil for it.
func Check(raw []byte, dst any) error {
	if !utf8.Valid(raw) {
		return &Error{Code: "invalid_utf8", Message: "the body is not valid UTF-8"}
	}
	if err := checkEscapes(raw); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var t reflect.Type
	if dst != nil {
		t = reflect.TypeOf(dst)
	}
	err := walk(dec, t, "", 0)
	var se *Error
	if errors.As(err, &se) {
		return se
	}
	return nil // a syntax error: the decoder reports it
}

// walk reads one JSON value whose Go type is t (nil: any).
func walk(dec *json.Decoder, t reflect.Type, path string, depth int) error {
	if depth > maxDepth {
		return &Error{Code: "invalid_json", Message: fmt.Sprintf("the body nests deeper than %d levels", maxDepth)}
	}
	t = deref(t)
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch d {
	case '{':
		var fields map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			fields = jsonFields(t)
		}
		seen := map[string]string{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			name := join(path, key)
			folded := foldKey(key)
			if prev, dup := seen[folded]; dup {
				msg := fmt.Sprintf("%s: given twice", name)
				if prev != key {
					msg = fmt.Sprintf("%s: given twice (as %q and %q; keys are matched case-insensitively)", name, prev, key)
				}
				return &Error{Code: "duplicate_field", Field: name, Message: msg}
			}
			seen[folded] = key
			var elem reflect.Type
			switch {
			case fields != nil:
				ft, exact := fields[key]
				if !exact {
					for k := range fields {
						if foldKey(k) == folded {
							return &Error{Code: "unknown_field", Field: name,
								Message: fmt.Sprintf("%s: unknown field (did you mean %q? names are case-sensitive)", name, join(path, k))}
						}
					}
				}
				elem = ft // nil for an unknown key: the decoder refuses it
			case t != nil && t.Kind() == reflect.Map:
				elem = t.Elem()
			}
			if err := walk(dec, elem, name, depth+1); err != nil {
				return err
			}
		}
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walk(dec, elem, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// jsonFields returns the JSON names of t's fields, with their types, as
// encoding/json sees them: the tag's name or the field's, embedded structs'
// fields promoted, "-" and unexported fields left out.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			if et := deref(f.Type); et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					if _, shadowed := out[k]; !shadowed {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// foldKey folds a key as encoding/json does when it matches keys to fields
// (each rune to the smallest of its simple case folding orbit: "K", "k" and
// the Kelvin sign are one), so that every pair it would merge is one here.
func foldKey(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(foldRune(r))
	}
	return b.String()
}

func foldRune(r rune) rune {
	min := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		if f < min {
			min = f
		}
	}
	return min
}

// checkEscapes refuses \u escapes of lone surrogates in the body's
// strings (U+0000 and other control characters are left to each field's
// validation, which names the field). It runs on valid UTF-8 and only looks inside strings.
func checkEscapes(raw []byte) error {
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 >= len(raw) {
				return nil
			}
			if raw[i+1] != 'u' {
				i++
				continue
			}
			r, ok := hex4(raw, i+2)
			if !ok {
				return nil // a syntax error: the decoder reports it
			}
			i += 5
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return &Error{Code: "invalid_utf8", Message: "a string of the body holds a lone surrogate escape"}
			case r >= 0xD800 && r <= 0xDBFF:
				if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					if lo, ok := hex4(raw, i+3); ok && lo >= 0xDC00 && lo <= 0xDFFF {
						i += 6
						continue
					}
				}
				return &Error{Code: "invalid_utf8", Message: "a string of the body holds a lone surrogate escape"}
			}
		}
	}
	return nil
}

func hex4(raw []byte, at int) (rune, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// Decode is the decoder every handler's body goes through: the strict
// pass, then encoding/json with unknown fields refused.
func Decode(raw []byte, dst any) error {
	if err := Check(raw, dst); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	// Not dec.More: it is false before a stray '}' or ']'.
	if len(bytes.TrimSpace(raw[dec.InputOffset():])) > 0 {
		return ErrTrailingData
	}
	return nil
}

// ErrTrailingData: the body holds more than one JSON value.
var ErrTrailingData = errors.New("the body holds data after its JSON value")
