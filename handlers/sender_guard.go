package handlers

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
// (a proxy would resolve the name itself, out of the guard's sight) and
// no redirect followed.
func guardedClient(cfg NotifyConfig) (*http.Client, error) {
	var tr *http.Transport
	client := &http.Client{}
	if cfg.Client != nil {
		c := *cfg.Client // a copy: the caller's client keeps its own policy
		client = &c
	}
	switch t := client.Transport.(type) {
	case nil:
		// The default transport keeps 2 idle connections per host: with
		// PerMerchant requests in flight to one merchant, the others would
		// open a connection each time.
		tr = http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = max(cfg.PerMerchant, tr.MaxIdleConnsPerHost)
	case *http.Transport:
		tr = t.Clone()
	default:
		return client, fmt.Errorf("notify config: Client.Transport must be nil or an *http.Transport, not %T: the Sender installs its address guard in it", t)
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

// Coarse causes of a failed attempt, as recorded: whoever reads a
// delivery's attempts learns whether the merchant answered, not what the
// network looked like (no address, port or resolver error), so the
// webhook URL cannot serve to map it.
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

// signature is the webhook-signature header of d: its merchant's secret's
// signature, then, during a rotation's grace period, the previous
// secret's, space-separated as Standard Webhooks allows, so a merchant
// verifying with either secret accepts it.
func (s *Sender) signature(d delivery, ts string) (string, error) {
	sig, err := s.signWith(*d.Secret, d, ts)
	if err != nil {
		return "", err
	}
	if d.PrevSecret != nil {
		prev, err := s.signWith(*d.PrevSecret, d, ts)
		if err != nil {
			return "", fmt.Errorf("previous secret: %w", err)
		}
		sig += " " + prev
	}
	return sig, nil
}

func (s *Sender) signWith(stored string, d delivery, ts string) (string, error) {
	secret, err := secretseal.Open(s.cfg.SecretKey, stored, d.MerchantID)
	if err != nil {
		return "", err
	}
	return signing.Sign(secret, d.MessageID, ts, d.Body)
}
