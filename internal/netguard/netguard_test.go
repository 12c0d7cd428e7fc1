package netguard_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/netguard"
)

func TestCheckURL(t *testing.T) {
	t.Parallel()
	strict, dev := netguard.Policy{}, netguard.Policy{AllowPrivate: true}
	tests := []struct {
		url        string
		strictOK   bool
		devOK      bool
		wantReason string // of the strict refusal
	}{
		{"https://shop.example/hooks", true, true, ""},
		{"https://shop.example:8443/hooks?x=1", true, true, ""},
		{"https://8.8.8.8/h", true, true, ""},
		{"https://[2606:4700:4700::1111]/h", true, true, ""},
		{"http://shop.example/hooks", false, true, "https"},
		{"ftp://shop.example/hooks", false, false, "https"},
		{"/relative", false, false, "https"},
		{"https://user:pw@shop.example/", false, false, "credentials"},
		{"https:opaque", false, false, "https"},
		{"https://", false, false, "host"},
		{"http://:80/", false, false, "https"},
		{"https://:443/", false, false, "host"},
		{"https://shop.example:0/", false, false, "port"},
		{"https://shop.example:65536/", false, false, "port"},
		{"https://shop.example:/", false, false, "port"},
		{"https://shop.example:99999999999999999999/", false, false, "port"},
		{"https://shop.example/" + strings.Repeat("a", netguard.MaxURLLen), false, false, "2048"},
		{"https://127.0.0.1/", false, true, "private"},
		{"https://127.1.2.3:6379/", false, true, "private"},
		{"https://10.0.0.1/", false, true, "private"},
		{"https://172.16.5.4/", false, true, "private"},
		{"https://192.168.1.1/", false, true, "private"},
		{"https://169.254.169.254/latest/meta-data", false, true, "private"},
		{"https://100.64.0.1/", false, true, "private"},
		{"https://100.127.255.255/", false, true, "private"},
		{"https://0.0.0.0/", false, true, "private"},
		{"https://224.0.0.1/", false, true, "private"},
		{"https://255.255.255.255/", false, true, "private"},
		{"https://[::1]/", false, true, "private"},
		{"https://[::]/", false, true, "private"},
		{"https://[fc00::1]/", false, true, "private"},
		{"https://[fd12:3456::1]/", false, true, "private"},
		{"https://[fe80::1]/", false, true, "private"},
		{"https://[fe80::1%25eth0]/", false, true, "private"},
		{"https://[ff02::1]/", false, true, "private"},
		{"https://[::ffff:169.254.169.254]/", false, true, "private"},
		{"https://[::ffff:127.0.0.1]/", false, true, "private"},
		{"https://[::ffff:a9fe:a9fe]/", false, true, "private"},
		{"https://[::169.254.169.254]/", false, true, "private"},
		{"https://[::127.0.0.1]/", false, true, "private"},
		{"https://[64:ff9b::a9fe:a9fe]/", false, true, "private"},
		{"https://[2002:a9fe:a9fe::]/", false, true, "private"},
		{"https://2130706433/", false, true, "private"}, // 127.0.0.1 as one number
		{"https://0x7f.1/", false, true, "private"},     // 127.0.0.1, hex and short
		{"https://0177.0.0.1/", false, true, "private"}, // octal
		{"https://0xa9fea9fe/", false, true, "private"}, // 169.254.169.254
		{"https://localhost/", false, true, "private"},
		{"https://LOCALHOST./", false, true, "private"},
		{"https://api.localhost:8080/", false, true, "private"},
		{"https://1e100.net/", true, true, ""}, // a name, not a number
	}
	for _, tt := range tests {
		_, err := strict.CheckURL(tt.url)
		require.Equal(t, tt.strictOK, err == nil, "strict %q: %v", tt.url, err)
		if err != nil {
			require.Contains(t, err.Error(), tt.wantReason, tt.url)
			require.Equal(t, tt.wantReason == "private", errors.Is(err, netguard.ErrBlocked), "%q matches ErrBlocked", tt.url)
		}
		_, err = dev.CheckURL(tt.url)
		require.Equal(t, tt.devOK, err == nil, "AllowPrivate %q: %v", tt.url, err)
	}
}

// unicodeSpellings are hosts that net/http maps (IDNA's lookup profile)
// before it dials: each is refused at creation as its mapped form is.
var unicodeSpellings = []struct {
	host   string
	mapped string // what net/http dials
	reason string // of the strict refusal; "" accepted
}{
	{"１２７．０．０．１", "127.0.0.1", "private"},             // fullwidth digits and full stops
	{"127。0。0。1", "127.0.0.1", "private"},             // ideographic full stops (U+3002)
	{"127．0．0．1", "127.0.0.1", "private"},             // fullwidth full stops (U+FF0E)
	{"127｡0｡0｡1", "127.0.0.1", "private"},             // halfwidth ideographic full stops (U+FF61)
	{"127.0.0.１", "127.0.0.1", "private"},             // one fullwidth digit
	{"①②⑦.0.0.1", "127.0.0.1", "private"},             // circled digits
	{"１６９．２５４．１６９．２５４", "169.254.169.254", "private"}, // cloud metadata
	{"１０。０。０。１", "10.0.0.1", "private"},
	{"０ｘ７ｆ．１", "0x7f.1", "private"},         // hex and short, fullwidth
	{"２１３０７０６４３３", "2130706433", "private"}, // one number, fullwidth
	{"ｌｏｃａｌｈｏｓｔ", "localhost", "private"},
	{"ＬＯＣＡＬＨＯＳＴ", "localhost", "private"},
	{"ⓛⓞⓒⓐⓛⓗⓞⓢⓣ", "localhost", "private"},
	{"localhost。", "localhost.", "private"},
	{"local­host", "localhost", "private"}, // a soft hyphen, ignored
	{"localhost​", "localhost", "private"}, // a zero-width space, ignored
	{"api．ｌｏｃａｌｈｏｓｔ", "api.localhost", "private"},
	{"ｅｘａｍｐｌｅ.com", "example.com", ""},
	{"bücher.example", "xn--bcher-kva.example", ""},
	{"ü_ber.example", "", "valid host"}, // does not map: no resolver answers it
}

// A host spelled in Unicode is checked as net/http will dial it, mapped:
// a private address or a loopback name in any such spelling is refused
// as its ASCII form is.
func TestCheckURLMapsUnicodeHosts(t *testing.T) {
	t.Parallel()
	for _, tt := range unicodeSpellings {
		raw := "https://" + tt.host + ":8443/hooks"
		_, err := netguard.Policy{}.CheckURL(raw)
		if tt.reason == "" {
			require.NoError(t, err, tt.host)
		} else {
			require.ErrorContains(t, err, tt.reason, tt.host)
			require.Equal(t, tt.reason == "private", errors.Is(err, netguard.ErrBlocked), "%q matches ErrBlocked", tt.host)
		}
		mapped, ok := netguard.LookupHost(tt.host)
		require.Equal(t, tt.mapped != "", ok, tt.host)
		if ok {
			require.Equal(t, tt.mapped, mapped, tt.host)
		}
		_, err = netguard.Policy{AllowPrivate: true}.CheckURL(raw)
		require.Equal(t, tt.reason == "valid host", err != nil, "AllowPrivate %q: %v", tt.host, err)
	}
}

// Creation refuses what delivery would refuse: for each spelling, the host
// that Go's HTTP client really dials (caught at its DialContext, which
// dials nothing) is checked as CheckURL checks the URL, and both agree.
func TestCheckURLAgreesWithTheHostNetHTTPDials(t *testing.T) {
	t.Parallel()
	var dialled string
	client := &http.Client{Transport: &http.Transport{Proxy: nil,
		DialContext: func(_ context.Context, _, addr string) (net.Conn, error) {
			dialled = addr
			return nil, errors.New("not dialled")
		}}}
	for _, tt := range unicodeSpellings {
		dialled = ""
		raw := "http://" + tt.host + ":8443/hooks" // plain http: the dial is all there is
		res, err := client.Get(raw)
		if err == nil {
			res.Body.Close()
		}
		require.Error(t, err)
		host, port, err := net.SplitHostPort(dialled)
		require.NoError(t, err, "%s dialled %q", tt.host, dialled)
		require.Equal(t, "8443", port)
		if tt.mapped != "" {
			require.Equal(t, tt.mapped, host, "net/http dials what LookupHost says")
		}
		_, atCreation := netguard.Policy{}.CheckURL("https://" + tt.host + "/")
		_, atDelivery := netguard.Policy{}.CheckURL("https://" + host + "/")
		require.Equal(t, atDelivery != nil, atCreation != nil, "%s (dialled as %s): creation %v, delivery %v", tt.host, host, atCreation, atDelivery)
	}
}

func TestPublic(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700:4700::1111": true, "93.184.216.34": true,
		"127.0.0.1": false, "10.1.2.3": false, "100.64.0.0": false, "169.254.0.1": false, "192.0.0.8": false,
		"198.18.0.1": false, "240.0.0.1": false, "::ffff:10.0.0.1": false, "::ffff:8.8.8.8": true,
		"fc00::": false, "fe80::1": false, "ff0e::1": false, "::": false, "::1": false, "2001:db8::1": false,
		"2001:0:a9fe:a9fe::": false, // Teredo
	} {
		require.Equal(t, want, netguard.Public(netip.MustParseAddr(addr)), addr)
	}
	require.False(t, netguard.Public(netip.Addr{}))
}

// FuzzCheckURL: whatever CheckURL accepts under the strict policy is an
// https URL of at most MaxURLLen bytes with a host, no credentials, and no
// literal address that is not public.
func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{
		"https://shop.example/hooks", "http://:80/", "https://[::ffff:169.254.169.254]/", "https://0x7f.1/",
		"https://2130706433/", "https://localhost./", "https://a:b@c/", "https://shop.example:0/", "https://[fe80::1%25en0]:8443/",
		"https://%31%32%37.0.0.1/", "https://127.0.0.1.nip.io/", "HTTPS://EXAMPLE.COM", "https://[::]:443", "https://0/",
		"https://１２７．０．０．１/", "https://ｌｏｃａｌｈｏｓｔ/", "https://127。0。0。1/", "https://①②⑦.0.0.1/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := netguard.Policy{}.CheckURL(raw)
		if err != nil {
			return
		}
		if len(raw) > netguard.MaxURLLen || u.Scheme != "https" || u.Hostname() == "" || u.User != nil {
			t.Fatalf("accepted %q", raw)
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && !netguard.Public(a) {
			t.Fatalf("accepted %q: %s is not public", raw, a)
		}
		// Nor once mapped as net/http maps it before it dials.
		mapped, ok := netguard.LookupHost(u.Hostname())
		if !ok {
			t.Fatalf("accepted %q: its host does not map", raw)
		}
		if a, err := netip.ParseAddr(mapped); err == nil && !netguard.Public(a) {
			t.Fatalf("accepted %q: dialled as %s, not public", raw, a)
		}
		if h := strings.ToLower(strings.TrimSuffix(mapped, ".")); h == "localhost" || strings.HasSuffix(h, ".localhost") {
			t.Fatalf("accepted %q: dialled as %s", raw, mapped)
		}
		// What the HTTP client will connect to is what was checked.
		again, err := url.Parse(u.String())
		if err != nil || again.Hostname() != u.Hostname() || again.Port() != u.Port() {
			t.Fatalf("%q does not round trip: %v", raw, err)
		}
	})
}

// fakeResolver answers every name with its addresses: a name that
// resolves privately, as DNS rebinding would make it.
type fakeResolver []netip.Addr

func (r fakeResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return r, nil
}

func TestDialerChecksResolvedAddresses(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	loopback := fakeResolver{netip.MustParseAddr("127.0.0.1")}
	mixed := fakeResolver{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("127.0.0.1")}

	get := func(d *netguard.Dialer, host string) error {
		client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
		res, err := client.Get("http://" + net.JoinHostPort(host, port) + "/")
		if err == nil {
			res.Body.Close()
		}
		return err
	}
	for _, tt := range []struct {
		d    *netguard.Dialer
		host string
	}{
		{&netguard.Dialer{Resolver: loopback}, "rebound.example"},
		{&netguard.Dialer{Resolver: mixed}, "mixed.example"},
		{&netguard.Dialer{}, "127.0.0.1"},
		{&netguard.Dialer{}, "localhost"},
		{&netguard.Dialer{}, "0x7f.1"},
		{&netguard.Dialer{}, "::ffff:127.0.0.1"},
	} {
		err := get(tt.d, tt.host)
		require.ErrorIs(t, err, netguard.ErrBlocked, tt.host)
	}
	require.NoError(t, get(&netguard.Dialer{Policy: netguard.Policy{AllowPrivate: true}, Resolver: loopback}, "rebound.example"))
	require.NoError(t, get(&netguard.Dialer{Policy: netguard.Policy{AllowPrivate: true}}, "127.0.0.1"))
}
