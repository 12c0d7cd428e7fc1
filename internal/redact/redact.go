// Package redact hides secrets in what is logged or put in an error: the
// one place that knows what a secret in a connection string looks like.
package redact

import (
	"net/url"
	"sort"
	"strings"
)

// Mask replaces every secret this package hides.
const Mask = "xxxxx"

// URL hides a URL's password and the values of its password-like query
// parameters ([SecretParam]), so that the URL can be logged or shown in an
// error. A URL that does not parse is not shown at all: it may hold a
// password in a place url.Parse missed.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.Opaque != "" && strings.Contains(u.Opaque, "@")) {
		return "(unparseable URL)"
	}
	if q, err := url.ParseQuery(u.RawQuery); err == nil {
		changed := false
		for k := range q {
			if SecretParam(k) {
				for i := range q[k] {
					q[k][i] = Mask
				}
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	} else if u.RawQuery != "" {
		u.RawQuery = "(unparseable query)"
	}
	if u.Fragment != "" {
		u.Fragment, u.RawFragment = "", ""
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), Mask)
	} else if u.User != nil && tokenInUser(u.Scheme) {
		u.User = url.User(Mask)
	}
	return u.String()
}

// tokenInUser reports the schemes whose userinfo without a password is a
// token: nats://TOKEN@host.
func tokenInUser(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "nats", "tls", "ws", "wss":
		return true
	}
	return false
}

// secretWords are the parameter names (or parts of names) that carry a
// secret, compared case-insensitively with '-' and '_' ignored.
var secretWords = []string{"password", "passwd", "pwd", "pass", "secret", "token", "apikey", "key", "auth", "credential", "signature", "sig"}

// SecretParam reports whether a query or key=value parameter named name
// carries a secret: password, sslpassword, passwd, secret, token,
// api_key, key, access_token, client_secret, ... in any case.
func SecretParam(name string) bool {
	n := strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(name))
	switch n {
	case "sslkey", "sslcert", "sslrootcert", "sslcrl", "keyspace", "authsource", "authmechanism":
		return false // file names and settings, not secrets
	}
	for _, w := range secretWords {
		if n == w || strings.HasSuffix(n, w) || strings.HasPrefix(n, w) {
			return true
		}
	}
	return false
}

// Secrets returns the secrets a connection string holds (URL or
// key=value): its password and the values of its secret parameters, raw
// and percent-decoded. [Text] scrubs them out of what a library printed.
func Secrets(conn string) []string {
	var out []string
	add := func(v string) {
		if len(v) >= 3 { // shorter would scrub unrelated text; and is no secret worth the name
			out = append(out, v)
		}
		if d, err := url.QueryUnescape(v); err == nil && d != v && len(d) >= 3 {
			out = append(out, d)
		}
	}
	if u, err := url.Parse(conn); err == nil && u.Scheme != "" && u.Host != "" {
		if p, ok := u.User.Password(); ok {
			add(p)
			// And as written, percent-encoded.
			_, rest, _ := strings.Cut(conn, "://")
			rest, _, _ = strings.Cut(rest, "?")
			if at := strings.LastIndex(rest, "@"); at >= 0 {
				if _, raw, ok := strings.Cut(rest[:at], ":"); ok {
					add(raw)
				}
			}
		} else if u.User != nil && tokenInUser(u.Scheme) {
			add(u.User.Username())
		}
		for _, kv := range strings.Split(u.RawQuery, "&") {
			k, v, _ := strings.Cut(kv, "=")
			if dk, err := url.QueryUnescape(k); err == nil && SecretParam(dk) {
				add(v)
			}
		}
		return out
	}
	// A key=value DSN, or a URL that does not parse: every value after a
	// secret key, and what sits between "//user:" and "@".
	params := strings.Fields(conn)
	if _, query, ok := strings.Cut(conn, "?"); ok {
		params = append(params, strings.FieldsFunc(query, func(r rune) bool { return r == '&' || r == ';' })...)
	}
	for _, f := range params {
		k, v, ok := strings.Cut(f, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if ok && SecretParam(k) {
			add(strings.Trim(v, `'"`))
		}
	}
	// The userinfo of a URL that does not parse, or of a host:port list
	// entry (user:pass@host:port): a password after the first ':', or the
	// whole of it (a token) when it has none.
	for _, part := range strings.Split(conn, ",") {
		_, rest, isURL := strings.Cut(part, "://")
		if !isURL {
			rest = part
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				add(pw)
			} else {
				add(rest[:at])
			}
		}
	}
	return out
}

// DSN hides the secret values of a key=value connection string
// (host=h password=p ...).
func DSN(s string) string {
	fields := strings.Fields(s)
	for i, f := range fields {
		if k, _, ok := strings.Cut(f, "="); ok && SecretParam(k) {
			fields[i] = k + "=" + Mask
		}
	}
	return strings.Join(fields, " ")
}

// Text replaces every secret of conns (connection strings: see [Secrets])
// found in s: for messages a library wrote, which may quote a connection
// string whole.
func Text(s string, conns ...string) string {
	var secrets []string
	for _, c := range conns {
		secrets = append(secrets, Secrets(c)...)
	}
	// Longest first, so that a secret holding another is replaced whole.
	sort.Slice(secrets, func(i, j int) bool { return len(secrets[i]) > len(secrets[j]) })
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, Mask)
	}
	return s
}
