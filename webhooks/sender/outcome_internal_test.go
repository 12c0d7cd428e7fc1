package sender

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestOutcome(t *testing.T) {
	s := New(nil, Config{Schedule: []time.Duration{time.Second, 10 * time.Second, time.Minute}, Jitter: 0.2})
	for _, tc := range []struct {
		name       string
		attempts   int // before this one
		code       int
		err        error
		permanent  bool
		retryAfter time.Duration
		status     string
		delayMin   time.Duration
		delayMax   time.Duration
		openFor    time.Duration
	}{
		{name: "2xx", code: 204, retryAfter: -1, status: "delivered"},
		{name: "first failure: step 1 jittered", code: 500, retryAfter: -1, status: "pending", delayMin: 800 * time.Millisecond, delayMax: 1200 * time.Millisecond},
		{name: "second failure: step 2", attempts: 1, code: 0, err: errors.New("timeout"), retryAfter: -1, status: "pending", delayMin: 8 * time.Second, delayMax: 12 * time.Second},
		{name: "after the last step: failed", attempts: 3, code: 500, retryAfter: -1, status: "failed"},
		{name: "4xx fails at once", code: 400, retryAfter: -1, status: "failed"},
		{name: "410 fails at once", code: 410, retryAfter: -1, status: "failed"},
		{name: "408 retried", code: 408, retryAfter: -1, status: "pending", delayMin: 800 * time.Millisecond, delayMax: 1200 * time.Millisecond},
		{name: "redirect retried", code: 302, retryAfter: -1, status: "pending", delayMin: 800 * time.Millisecond, delayMax: 1200 * time.Millisecond},
		{name: "Retry-After replaces the step", code: 500, retryAfter: 30 * time.Second, status: "pending", delayMin: 30 * time.Second, delayMax: 30 * time.Second},
		{name: "Retry-After capped at the longest step", code: 500, retryAfter: time.Hour, status: "pending", delayMin: time.Minute, delayMax: time.Minute},
		{name: "429 Retry-After opens the circuit", code: 429, retryAfter: 5 * time.Second, status: "pending", delayMin: 5 * time.Second, delayMax: 5 * time.Second, openFor: 5 * time.Second},
		{name: "503 Retry-After opens the circuit, capped", code: 503, retryAfter: time.Hour, status: "pending", delayMin: time.Minute, delayMax: time.Minute, openFor: time.Minute},
		{name: "permanent error", err: errors.New("render"), permanent: true, retryAfter: -1, status: "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 { // the jitter
				r := s.outcomeOf(delivery{Attempts: tc.attempts}, result{code: tc.code, err: tc.err, permanent: tc.permanent, retryAfter: tc.retryAfter})
				if r.status != tc.status || r.delay < tc.delayMin || r.delay > tc.delayMax || r.openFor != tc.openFor {
					t.Fatalf("outcome = %s after %s, circuit %s; want %s after [%s, %s], circuit %s",
						r.status, r.delay, r.openFor, tc.status, tc.delayMin, tc.delayMax, tc.openFor)
				}
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"120", 2 * time.Minute, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
	} {
		if got, ok := parseRetryAfter(tc.in, now); got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestResponseBody(t *testing.T) {
	raw := []byte(`{"token":"tok_live_123","msg":"` + strings.Repeat("é", 2000) + "\xff\xfe")
	got := responseBody(raw, 1024)
	if len(got) > 1024 || !utf8.ValidString(got) || strings.Contains(got, "tok_live_123") || !strings.Contains(got, `"token":"xxxxx"`) {
		t.Fatalf("responseBody = %d bytes, valid %v: %.80q", len(got), utf8.ValidString(got), got)
	}
	if got := responseBody([]byte("ok\xff"), 1024); got != "ok\uFFFD" {
		t.Fatalf("responseBody(invalid UTF-8) = %q", got)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		field string
		cfg   Config
	}{
		{"Schedule", Config{Schedule: []time.Duration{}}},
		{"Schedule[1]", Config{Schedule: []time.Duration{time.Second, 0}}},
		{"Jitter", Config{Jitter: 1.5}},
		{"Concurrency", Config{Concurrency: -1}},
		{"PerEndpoint", Config{Concurrency: 2, PerEndpoint: 3}},
		{"SuspectConcurrency", Config{Concurrency: 2, SuspectConcurrency: 3}},
		{"CircuitCooldownMax", Config{CircuitCooldown: time.Hour, CircuitCooldownMax: time.Minute}},
		{"MaxResponseBody", Config{MaxResponseBody: -1}},
		{"Timeout", Config{Timeout: -time.Second}},
		{"DisableAfter", Config{DisableAfter: -time.Second}},
	} {
		t.Run(tc.field, func(t *testing.T) {
			c := tc.cfg
			c.setDefaults()
			err := c.validate()
			if err == nil || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("validate() = %v, want an error naming %s", err, tc.field)
			}
		})
	}
	var c Config
	c.setDefaults()
	if err := c.validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.SuspectConcurrency != 16 || c.PerEndpoint != 4 || len(c.Schedule) != 10 || c.MaxResponseBody != 1024 {
		t.Fatalf("defaults: %+v", c)
	}
}
