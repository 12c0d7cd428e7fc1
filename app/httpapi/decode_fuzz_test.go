package httpapi

import (
	"bytes"
	"encoding/json"
	"github.com/outflow-dev/outflow/internal/strictjson"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outflow-dev/outflow/app"
)

// The request decoding, for every body the handlers read: the strict pass
// and encoding/json never panic, and what they accept is one JSON value of
// valid UTF-8 without duplicate keys, that re-encodes to a body decoding to
// the same request; then the request's validation never panics, and what
// it accepts is within the service's limits.
func FuzzDecodeRequest(f *testing.F) {
	for _, seed := range []string{
		`{"merchant_id":"0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60","amount":1250,"currency":"EUR"}`,
		`{"merchant_id":"0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60","amount":1000000000000000,"currency":"EUR"}`,
		`{"amount":1,"amount":2}`,
		`{"amount":1,"AMOUNT":2}`,
		`{"Amount":5}`,
		"{\"webhoo\u212a_url\":\"x\"}",
		`{"name":"Acme","webhook_url":"https://x.example/h"}`,
		"{\"name\":\"Acme\u202e\",\"webhook_url\":\"https://x.example/h\"}",
		`{"name":"\u200b\u200b","webhook_url":"https://x.example/h"}`,
		`{"name":"A\ud800","webhook_url":"https://x.example/h"}`,
		`{"name":"A\ud83d\ude00","webhook_url":"https://x.example/h"}`,
		"{\"name\":\"\xff\"}",
		`{"amount":9223372036854775807}`,
		`{"amount":1e3}`,
		`{}`, `[]`, `{"a":[[[[{}]]]]}`, `{"amount":5}]`, `{"amount":5}}`, `null`, `"x"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		check := func(dst any) bool {
			if err := strictjson.Decode(raw, dst); err != nil {
				return false
			}
			if !utf8.Valid(raw) || !json.Valid(raw) {
				t.Fatalf("accepted a body that is not one valid UTF-8 JSON value: %q", raw)
			}
			if dup := duplicateKey(raw); dup != "" {
				t.Fatalf("accepted a body with the key %q twice: %q", dup, raw)
			}
			again := reflect.New(reflect.TypeOf(dst).Elem())
			enc, err := json.Marshal(dst)
			if err != nil {
				t.Fatalf("re-encode %T: %v", dst, err)
			}
			if err := strictjson.Decode(enc, again.Interface()); err != nil {
				t.Fatalf("the re-encoded %s does not decode: %v", enc, err)
			}
			if !reflect.DeepEqual(dst, again.Interface()) {
				t.Fatalf("round trip changed %#v into %#v", dst, again.Interface())
			}
			return true
		}
		var p app.NewPayment
		if check(&p) && p.Validate() == nil {
			if p.Amount <= 0 || p.Amount > app.MaxAmount || !app.ValidCurrency(p.Currency) {
				t.Fatalf("valid payment out of bounds: %+v", p)
			}
		}
		var m app.NewMerchant
		if check(&m) && m.Validate() == nil {
			name := strings.TrimSpace(m.Name)
			if !utf8.ValidString(name) || strings.ContainsAny(name, "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069") || name == "" {
				t.Fatalf("valid merchant with a bad name: %q", m.Name)
			}
		}
		var r refundBody
		check(&r)
		var e emptyBody
		check(&e)
	})
}

// duplicateKey returns a key given twice, case-insensitively, in one
// object of a valid JSON body: an oracle written apart from strictjson.Check.
func duplicateKey(raw []byte) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	var walk func() string
	walk = func() string {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, _ := dec.Token()
				key := strings.ToLower(k.(string))
				key = strings.ReplaceAll(key, "\u212a", "k")
				key = strings.ReplaceAll(key, "\u017f", "s")
				if seen[key] {
					return k.(string)
				}
				seen[key] = true
				if d := walk(); d != "" {
					return d
				}
			}
			_, _ = dec.Token()
		case json.Delim('['):
			for dec.More() {
				if d := walk(); d != "" {
					return d
				}
			}
			_, _ = dec.Token()
		}
		return ""
	}
	return walk()
}
