// Package httpapi serves the payments service as JSON over net/http.
//
// Errors are {"error": {"code", "message", "field"}} with a fitting status:
// 400 for a body that is not JSON or has an unknown or mistyped field, 404
// for an unknown id, 409 for a transition the payment's status does not
// allow, 413 for a body over 1 MiB, 422 for a value that is well-formed but
// invalid (a zero amount, an unknown currency) and for an Idempotency-Key
// reused with another request. A rejected request changes nothing.
//
// Bodies go through one strict decoder ([CheckStrict], then encoding/json
// refusing unknown fields): a key given twice or in another case, invalid
// UTF-8 and lone surrogate escapes are 400, so that no other reader of the
// body (a proxy, a log) can read it differently from the service.
//
// Every POST honours an Idempotency-Key header. The key is stored in the
// same database transaction as the command's effect, together with the
// response; a retry with the same key and the same request gets that
// response back (with Idempotent-Replayed: true) and has no second effect.
// Two concurrent requests with one key serialize on the key's row, so the
// second waits for the first and then replays it. [KeyExpiry] deletes keys
// older than a TTL (24h by default, as Stripe does); a request whose key
// has expired runs as a new one.
//
// Request bodies and responses are never logged: a merchant's response holds
// its webhook secret.
package httpapi
