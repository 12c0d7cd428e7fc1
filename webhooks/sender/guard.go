package sender

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/outflow-dev/outflow/internal/netguard"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

// guardedClient returns the Sender's client: cfg.Client's policy (or the
// default one) with every connection made by a [netguard.Dialer], no proxy
// and no redirect followed.
func guardedClient(cfg Config) (*http.Client, error) {
	var tr *http.Transport
	client := &http.Client{}
	if cfg.Client != nil {
		c := *cfg.Client // a copy: the caller's client keeps its own policy
		client = &c
	}
	switch t := client.Transport.(type) {
	case nil:
		// The default transport keeps 2 idle connections per host: with
		// PerEndpoint requests in flight to one endpoint, the others would
		// open a connection each time.
		tr = http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = max(cfg.PerEndpoint, tr.MaxIdleConnsPerHost)
	case *http.Transport:
		tr = t.Clone()
	default:
		return client, fmt.Errorf("webhook sender config: Client.Transport must be nil or an *http.Transport, not %T: the Sender installs its address guard in it", t)
	}
	guard := &netguard.Dialer{Policy: netguard.Policy{AllowPrivate: cfg.AllowPrivate}, Resolver: cfg.Resolver,
		Dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}}
	tr.Proxy = nil
	tr.DialContext = guard.DialContext
	tr.DialTLSContext = nil
	tr.DialTLS = nil //nolint:staticcheck // cleared so that it cannot bypass the guard
	tr.Dial = nil    //nolint:staticcheck // likewise
	client.Transport = tr
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return client, nil
}

// Coarse causes of a failed attempt, as recorded: whoever reads an
// endpoint's attempts learns whether it answered, not what the network
// looked like (no address, port or resolver error), so that an endpoint
// URL cannot serve to map it.
const (
	causeBlocked     = "blocked: private address"
	causeTimeout     = "timeout"
	causeTLS         = "tls error"
	causeDNS         = "dns lookup failed"
	causeUnreachable = "connection refused or unreachable"
)

// cause is the category recorded for a request that got no response.
func cause(err error) string {
	var (
		dnsErr   *net.DNSError
		netErr   net.Error
		certErr  *tls.CertificateVerificationError
		recErr   tls.RecordHeaderError
		alertErr tls.AlertError
		uaErr    x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invErr   x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, netguard.ErrBlocked):
		return causeBlocked
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return causeTimeout
	case errors.As(err, &certErr), errors.As(err, &recErr), errors.As(err, &alertErr), errors.As(err, &uaErr),
		errors.As(err, &hostErr), errors.As(err, &invErr):
		return causeTLS
	case errors.As(err, &dnsErr):
		return causeDNS
	}
	return causeUnreachable
}

// signature is d's webhook-signature header over body: the endpoint's
// current secret's signature, then, during a rotation's grace period, the
// previous secret's, so that a receiver verifying with either accepts it.
func (s *Sender) signature(d delivery, ts string, body []byte) (string, error) {
	secrets := make([]string, 0, 2)
	for i, stored := range []*string{&d.Secret, d.PrevSecret} {
		if stored == nil {
			continue
		}
		secret, err := secretseal.Open(s.cfg.SecretKey, *stored, d.EndpointID)
		if err != nil {
			if i == 1 {
				return "", fmt.Errorf("previous secret: %w", err)
			}
			return "", err
		}
		secrets = append(secrets, secret)
	}
	return signing.Header(secrets, d.MessageID, ts, body)
}
