package handlers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/netguard"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	netErr := errors.New("dial tcp: connection refused")
	tests := []struct {
		code      int
		err       error
		permanent bool
		want      verdict
	}{
		{200, nil, false, verdictDelivered},
		{204, nil, false, verdictDelivered},
		{0, netErr, false, verdictRetry},
		{301, nil, false, verdictRetry},
		{302, nil, false, verdictRetry},
		{307, nil, false, verdictRetry},
		{308, nil, false, verdictRetry},
		{400, nil, false, verdictDead},
		{401, nil, false, verdictDead},
		{404, nil, false, verdictDead},
		{408, nil, false, verdictRetry},
		{410, nil, false, verdictDead},
		{425, nil, false, verdictRetry},
		{429, nil, false, verdictRetry},
		{500, nil, false, verdictRetry},
		{503, nil, false, verdictRetry},
		{0, errors.New("cannot sign"), true, verdictDead},
		{100, nil, false, verdictDead},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, classify(tt.code, tt.err, tt.permanent), "code %d err %v permanent %v", tt.code, tt.err, tt.permanent)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"99999999999999", 365 * 24 * time.Hour, true},
	}
	for _, tt := range tests {
		got, ok := parseRetryAfter(tt.in, now)
		require.Equal(t, tt.wantOK, ok, tt.in)
		require.Equal(t, tt.want, got, tt.in)
	}
}

func TestTruncateKeepsUTF8Whole(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ab", truncate("ab", 5))
	require.Equal(t, "a", truncate("aé", 2)) // é is 2 bytes: cut before it
	require.Equal(t, "aé", truncate("aéb", 3))
}

func TestNotifyConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  NotifyConfig
		want string
	}{
		{NotifyConfig{Timeout: -1}, "Timeout"},
		{NotifyConfig{Concurrency: 2, PerMerchant: 3}, "PerMerchant"},
		{NotifyConfig{Backoff: time.Minute, BackoffMax: time.Second}, "BackoffMax"},
		{NotifyConfig{MaxAttempts: -1}, "MaxAttempts"},
	} {
		tt.cfg.setDefaults()
		require.ErrorContains(t, tt.cfg.validate(), tt.want)
	}
	require.ErrorContains(t, NewSender(nil, NotifyConfig{PerMerchant: -1}).Run(context.Background()), "PerMerchant",
		"Run refuses an invalid config at once")
}

func TestCauseIsCoarse(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 6379},
		Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	tests := []struct {
		err  error
		want string
	}{
		{&url.Error{Op: "Post", URL: "https://x.example/", Err: fmt.Errorf("netguard: %w", netguard.ErrBlocked)}, causeBlocked},
		{&url.Error{Op: "Post", URL: "https://x.example/", Err: refused}, causeUnreachable},
		{&url.Error{Op: "Post", URL: "https://x.example/", Err: context.DeadlineExceeded}, causeTimeout},
		{&url.Error{Op: "Post", URL: "https://x.example/", Err: &net.DNSError{Err: "no such host", Name: "x.example", Server: "10.0.0.2:53"}}, causeDNS},
		{&url.Error{Op: "Post", URL: "https://x.example/", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}, causeTLS},
		{&url.Error{Op: "Post", URL: "https://x.example/", Err: tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}}, causeTLS},
		{errors.New("EOF"), causeUnreachable},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, cause(tt.err), "%v", tt.err)
	}
}
