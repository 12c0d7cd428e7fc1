// Package strictjson decodes request bodies strictly: what encoding/json
// accepts silently (unknown, duplicate or case-mismatched keys, invalid
// UTF-8, escapes of unpaired surrogates, trailing data, nesting without
// bound) is refused with an [Error] naming the field. The reference app's
// API and the webhook package's routes decode with it, so that both refuse
// the same bodies the same way.
//
// It is our own code because encoding/json accepts all of this, and what
// the APIs promise is the field named in each refusal: a walk of the body
// against the destination's fields, small enough to keep beside it.
package strictjson
