package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// MaxURLLen bounds a webhook URL, in bytes.
const MaxURLLen = 2048

// ErrBlocked is returned (wrapped) for a destination the policy refuses.
var ErrBlocked = errors.New("blocked: private address")

// Policy says what outbound requests may reach.
type Policy struct {
	// AllowPrivate allows plain http and private, loopback and link-local
	// destinations: for local development and tests only.
	AllowPrivate bool
}

// blocked lists the ranges that are never a public destination, beyond
// what netip's predicates cover.
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // CGNAT
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and broadcast
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use NAT64
	netip.MustParsePrefix("100::/64"),        // discard-only
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("fc00::/7"),        // unique-local (IsPrivate too)
	netip.MustParsePrefix("fec0::/10"),       // deprecated site-local
	netip.MustParsePrefix("2002::/16"),       // 6to4: embeds any IPv4 address
	netip.MustParsePrefix("2001::/32"),       // Teredo: embeds any IPv4 address
	netip.MustParsePrefix("::/96"),           // IPv4-compatible (deprecated)
	netip.MustParsePrefix("64:ff9b::/96"),    // NAT64: embeds any IPv4 address
	netip.MustParsePrefix("::ffff:0:0:0/96"), // SIIT IPv4-translated
}

// Public reports whether a is a public unicast address: not loopback,
// private, link-local, CGNAT, unique-local, multicast, unspecified or
// reserved, in any of its spellings.
func Public(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	a = a.WithZone("").Unmap() // ::ffff:a.b.c.d is a.b.c.d
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range blocked {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// Allowed reports whether p lets a connection reach a.
func (p Policy) Allowed(a netip.Addr) bool {
	return p.AllowPrivate || Public(a)
}

// URLError says why a URL is refused; its message names no address beyond
// what the caller gave.
type URLError struct {
	Reason string
	// Private is set when the URL is refused for its destination.
	Private bool
}

func (e *URLError) Error() string { return e.Reason }

// Is makes a URL refused for its destination match [ErrBlocked].
func (e *URLError) Is(target error) bool { return target == ErrBlocked && e.Private }

var errPrivateURL = &URLError{Reason: "must not point at a private, loopback or link-local address", Private: true}

// CheckURL checks a webhook URL before it is stored: https (http too with
// AllowPrivate), at most MaxURLLen bytes, a host, a valid port, no
// credentials, and no destination that is not public by its spelling
// alone (an address literal, in any form, or a loopback name). It does
// not resolve names: [Dialer] checks where they lead at every connection.
func (p Policy) CheckURL(raw string) (*url.URL, error) {
	refuse := func(reason string) (*url.URL, error) { return nil, &URLError{Reason: reason} }
	if len(raw) > MaxURLLen {
		return refuse(fmt.Sprintf("must be at most %d bytes", MaxURLLen))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return refuse("is not a valid URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowPrivate:
	case u.Scheme == "http":
		return refuse("must be an https URL")
	default:
		return refuse("must be an absolute https URL")
	}
	if u.Opaque != "" || u.User != nil {
		return refuse("must be an absolute https URL without credentials")
	}
	host := u.Hostname()
	if host == "" {
		return refuse("must name a host")
	}
	host, ok := LookupHost(host)
	if !ok {
		return refuse("must name a valid host: not a domain name once mapped as IDNA's lookup maps it")
	}
	if port := u.Port(); port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return refuse("must have a port from 1 to 65535")
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return refuse("must have a port from 1 to 65535")
	}
	if p.AllowPrivate {
		return u, nil
	}
	if a, ok := parseAddr(host); ok {
		if !Public(a) {
			return nil, errPrivateURL
		}
		return u, nil
	}
	if loopbackName(host) {
		return nil, errPrivateURL
	}
	return u, nil
}

// LookupHost is host as Go's HTTP client dials it: net/http (its
// transport's canonicalAddr, through idnaASCII) maps a host that is not
// ASCII with IDNA's lookup profile (UTS #46: fullwidth digits and letters,
// ideographic and fullwidth full stops, enclosed alphanumerics, case, and
// code points ignored such as a zero-width space), so "１２７．０．０．１"
// and "ｌｏｃａｌｈｏｓｔ" are dialled as 127.0.0.1 and localhost. ok is false
// when a host that is not ASCII does not map (net/http would then dial it
// as it is, and no resolver answers such a name). An ASCII host is left as
// it is, as net/http leaves it.
func LookupHost(host string) (mapped string, ok bool) {
	if isASCII(host) {
		return host, true
	}
	mapped, err := idna.Lookup.ToASCII(host)
	if err != nil {
		return host, false
	}
	return mapped, true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// parseAddr reads an address literal as a connection would use it,
// including the legacy IPv4 spellings (octal, hex, fewer parts) that some
// resolvers still honour: "0x7f.1" is 127.0.0.1.
func parseAddr(host string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a, true
	}
	if a, ok := legacyIPv4(host); ok {
		return a, true
	}
	return netip.Addr{}, false
}

// legacyIPv4 parses inet_aton's forms: 1 to 4 parts, each decimal, octal
// (leading 0) or hex (0x); the last part fills the remaining bytes.
func legacyIPv4(s string) (netip.Addr, bool) {
	s = strings.TrimSuffix(s, ".")
	parts := strings.Split(s, ".")
	if len(parts) > 4 || s == "" {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		base := 10
		switch {
		case strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X"):
			base, p = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		if p == "" && base != 8 {
			return netip.Addr{}, false
		}
		if p == "" {
			p = "0"
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// loopbackName reports names that resolve to loopback by definition
// (RFC 6761) or by every common resolver's configuration.
func loopbackName(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost") || h == "localhost.localdomain" ||
		h == "ip6-localhost" || h == "ip6-loopback"
}

// Resolver resolves a host name; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer connects only to destinations its Policy allows. Use its
// DialContext as an http.Transport's, with no proxy: it resolves the name,
// refuses the connection if any address is not allowed (a name that
// answers with one public and one private address is refused, not dialled
// at the public one), then dials the checked addresses themselves, so
// nothing resolves the name again between check and connect. A Control
// function re-checks the address of every socket as a last line.
type Dialer struct {
	Policy Policy
	// Resolver defaults to net.DefaultResolver; tests give a name any
	// address.
	Resolver Resolver
	// Dialer makes the connections; its zero value is fine. Its Control
	// is replaced.
	Dialer net.Dialer
}

// DialContext connects to addr ("host:port") if the policy allows every
// address host resolves to. A refused destination is an error matching
// [ErrBlocked].
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("netguard: %w", err)
	}
	// net/http passes the host mapped already; another caller might not.
	if host, _ = LookupHost(host); !isASCII(host) {
		return nil, &net.DNSError{Err: "not a valid host name", Name: host, IsNotFound: true}
	}
	var addrs []netip.Addr
	if a, ok := parseAddr(host); ok {
		addrs = []netip.Addr{a}
	} else {
		r := d.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		ipNet := "ip"
		switch network {
		case "tcp4":
			ipNet = "ip4"
		case "tcp6":
			ipNet = "ip6"
		}
		if addrs, err = r.LookupNetIP(ctx, ipNet, host); err != nil {
			return nil, err
		}
		if len(addrs) == 0 {
			return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
	}
	for _, a := range addrs {
		if !d.Policy.Allowed(a) {
			return nil, fmt.Errorf("netguard: connect to %s: %w", host, ErrBlocked)
		}
	}
	nd := d.Dialer
	nd.Control = d.control
	var firstErr error
	for _, a := range addrs {
		conn, err := nd.DialContext(ctx, network, net.JoinHostPort(a.Unmap().String(), port))
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// control refuses a socket whose address the policy does not allow.
func (d *Dialer) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("netguard: %w", err)
	}
	if !d.Policy.Allowed(ap.Addr()) {
		return fmt.Errorf("netguard: %w", ErrBlocked)
	}
	return nil
}
