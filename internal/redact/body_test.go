package redact_test

import (
	"testing"

	"github.com/outflow-dev/outflow/internal/redact"
)

func TestBody(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", `{"error":"invalid amount","code":42}`, `{"error":"invalid amount","code":42}`},
		{"bearer", `Authorization: Bearer abc.def-ghi_123== rejected`, `Authorization: Bearer xxxxx rejected`},
		{"basic", `got basic dXNlcjpwYXNz`, `got basic xxxxx`},
		{"json string", `{"user":"ann","password":"hunter2","ok":false}`, `{"user":"ann","password":"xxxxx","ok":false}`},
		{"json escaped quote", `{"client_secret": "a\"b", "n": 1}`, `{"client_secret": "xxxxx", "n": 1}`},
		{"json number", `{"pin_token": 123456}`, `{"pin_token": xxxxx}`},
		{"json api key case", `{"API_KEY":"k-1","Access-Token":"t"}`, `{"API_KEY":"xxxxx","Access-Token":"xxxxx"}`},
		{"json cut short", `{"token":"abcdef`, `{"token":"xxxxx"`},
		{"form", `user=ann&password=hunter2&next=/home`, `user=ann&password=xxxxx&next=/home`},
		{"query", `see https://x.test/cb?access_token=zzz&id=7`, `see https://x.test/cb?access_token=xxxxx&id=7`},
		{"header line", "X-Debug: 1\nx-api-key: abc123\n", "X-Debug: 1\nx-api-key: xxxxx\n"},
		{"signing secret", `your secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw is wrong`, `your secret xxxxx is wrong`},
		{"not a secret", `{"author":"x"}`, `{"author":"xxxxx"}`}, // errs on the side of masking
		{"empty", ``, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := redact.Body(tc.in); got != tc.want {
				t.Errorf("Body(%q)\n = %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}
