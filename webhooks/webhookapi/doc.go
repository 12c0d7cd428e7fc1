// Package webhookapi is the HTTP API of an account's webhook endpoints and
// deliveries, for a service to mount under its own prefix and
// authentication: the package authenticates no one, and asks
// Config.Authorize whether the authenticated caller may act on the account
// the path names.
//
// The routes, relative to the prefix that holds the account (see
// [API.Routes] and [API.Mount]):
//
//	POST   /webhook_endpoints                                 201 endpoint + secret (shown once)
//	GET    /webhook_endpoints                                 200 {"data": [endpoint]}
//	GET    /webhook_endpoints/{endpoint}                      200 endpoint
//	PATCH  /webhook_endpoints/{endpoint}                      200 endpoint
//	DELETE /webhook_endpoints/{endpoint}                      200 {"id", "deleted": true}
//	POST   /webhook_endpoints/{endpoint}/disable              200 endpoint
//	POST   /webhook_endpoints/{endpoint}/enable               200 endpoint
//	POST   /webhook_endpoints/{endpoint}/secret/rotate        200 {"endpoint_id", "secret", "previous_secret_expires_at"}
//	GET    /webhook_endpoints/{endpoint}/messages             200 {"data": [delivery], "next_cursor"}
//	GET    /webhook_endpoints/{endpoint}/messages/{message}/attempts  200 {"data": [attempt]}
//	POST   /webhook_endpoints/{endpoint}/messages/{message}/resend    202 delivery
//	POST   /webhook_endpoints/{endpoint}/recover              202 {"recovered": n}
//	POST   /webhook_endpoints/{endpoint}/test                 202 {"message_id"}
//
// messages takes the query parameters status (pending, delivered,
// failed), event_type, before (the previous page's next_cursor) and limit.
// recover takes {"since": RFC 3339}: required, not in the future, at most
// Config.MaxRecoverAge (30 days) back, since older deliveries are the
// retention's. PATCH sets the fields present: "rate_limit": null removes
// the limit; url, description and event_types may not be null
// ("event_types": [] is every type). The commands without a body take an
// empty one or {}.
//
// Why it is built this way:
//
//   - Another account's endpoint, an account the caller may not act on,
//     and an id that is none are all 404 not_found, alike, so that a
//     caller learns nothing of what it may not see. Delivery routes look
//     the endpoint up first (in the command's transaction), so an unknown
//     endpoint is 404 rather than an empty page.
//   - The account is the path value Config.AccountParam, put in the
//     service's canonical form by Config.CanonicalAccount when the service
//     accepts several spellings of one id: endpoints stored under another
//     spelling would never receive the account's events.
//   - Errors are the reference app's: {"error": {"code", "message",
//     "field"}}; a body is decoded strictly (unknown, duplicate or
//     case-mismatched keys, wrong types, trailing data, invalid UTF-8 are
//     400 naming the field), and a bad value is 422 invalid_field naming
//     it; too many endpoints is 409 too_many_endpoints, a resend,
//     recovery or test to a disabled endpoint 409 endpoint_disabled; a
//     method the path lacks is 405 with Allow; anything else is 500 with
//     its detail in the log only. All of it is checked before the command's transaction, or
//     by the store before its statement: bad input changes nothing.
//   - Commands run through Config.Command when the service has one (its
//     Idempotency-Key wrapper): a response holding a secret implements
//     [ShownOncer], whose form without the secret is what a replay may
//     answer, since the secret is kept nowhere in plaintext. Such a
//     wrapper maps the packages' errors with [WriteKnownError].
//   - Config.Wake is called after a command that made deliveries due
//     answered 2xx (committed), so a sender in the process sends them at
//     once; not after one that failed.
package webhookapi
