// Package redact hides secrets in what is logged or put in an error.
package redact

import "net/url"

// URL hides a URL's password (and its query's password parameter), so that
// the URL can be logged or shown in an error. A URL that does not parse is
// not shown at all: it may hold a password in a place url.Parse missed.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
