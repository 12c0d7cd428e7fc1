package redact

import (
	"regexp"
	"strings"
)

var (
	// An Authorization-style credential: "Bearer <token>", "Basic <b64>".
	bodyBearer = regexp.MustCompile(`(?i)\b(bearer|basic)(\s+)[A-Za-z0-9\-._~+/]+=*`)
	// A signing secret as this framework writes them.
	bodyWhsec = regexp.MustCompile(`whsec_[A-Za-z0-9+/=]+`)
	// A JSON member: "name": "value" (the value's closing quote may have
	// been cut off), or "name": 1234 / true.
	bodyJSON = regexp.MustCompile(`"([^"\\]{1,64})"(\s*:\s*)("(?:[^"\\]|\\.)*(?:"|\\?$)|[^\s,}\]"]+)`)
	// A form, query or header-like pair: name=value or name: value at the
	// start of a line or after a separator.
	bodyPair = regexp.MustCompile(`(^|[\s?&;,{(])([A-Za-z][A-Za-z0-9_\-.]{0,63})(=|:[ \t]*)([^\s&;,"'}?]+)`)
)

// Body masks the secrets a free-form text may hold, such as an HTTP
// response's body recorded for whoever looks at a webhook's attempts:
// bearer and basic credentials, webhook signing secrets ("whsec_..."), and
// the values of JSON members, form fields and name: value pairs whose
// name [SecretParam] calls secret ("password", "client_secret", "token",
// "api_key", ...). It errs on the side of masking: a value whose name
// merely looks secret is masked too.
func Body(s string) string {
	s = bodyBearer.ReplaceAllString(s, "${1}${2}"+Mask)
	s = bodyWhsec.ReplaceAllString(s, Mask)
	s = bodyJSON.ReplaceAllStringFunc(s, func(m string) string {
		sub := bodyJSON.FindStringSubmatch(m)
		if !SecretParam(sub[1]) {
			return m
		}
		v := Mask
		if len(sub[3]) > 0 && sub[3][0] == '"' {
			v = `"` + Mask + `"`
		}
		return `"` + sub[1] + `"` + sub[2] + v
	})
	return bodyPair.ReplaceAllStringFunc(s, func(m string) string {
		sub := bodyPair.FindStringSubmatch(m)
		if !SecretParam(sub[2]) || sub[4] == Mask || strings.EqualFold(sub[4], "bearer") || strings.EqualFold(sub[4], "basic") {
			return m
		}
		return sub[1] + sub[2] + sub[3] + Mask
	})
}
