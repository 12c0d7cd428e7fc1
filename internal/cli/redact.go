package cli

import "net/url"

// redactURL hides a password so that a URL can be logged.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}
