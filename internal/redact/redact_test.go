package redact_test

import (
	"testing"

	"github.com/outflow-dev/outflow/internal/redact"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"postgres://u:secret@db/x?sslmode=disable", "postgres://u:xxxxx@db/x?sslmode=disable"},
		{"postgres://u@db/x?password=secret", "postgres://u@db/x?password=xxxxx"},
		{"nats://user@h:4222", "nats://user@h:4222"},
		{"redis://:pw@h:1", "redis://:xxxxx@h:1"},
		{"postgres://u:p@[::1", "(unparseable URL)"},
	} {
		if got := redact.URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
