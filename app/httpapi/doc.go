// Package httpapi serves the payments service as JSON over net/http.
//
// Every request but /healthz and /readyz carries "Authorization: Bearer
// <key>" (package apikey); a missing, unknown or revoked key is a 401, the
// same answer for all three. An admin key may do everything. A merchant's
// key acts on its own merchant only: a path naming another merchant, or a
// payment of another, answers exactly as an unknown id does (404), and a
// payment for another merchant as an unknown merchant_id does (422), so
// that a key learns nothing of what other merchants have. Every route
// under /v1/merchants/{id}/ calls requireMerchant first, every route on
// /v1/payments/{id} requirePayment.
//
// The merchant's webhook endpoints and deliveries are the webhook
// package's routes (webhooks/webhookapi), mounted under
// /v1/merchants/{id}: the same authentication, a merchant's key on its own
// merchant only (another merchant's endpoints are 404), an admin key on
// merchants that exist, the merchant id in any case the API accepts
// (stored lower-case, as the merchant's events name it), the same
// Idempotency-Key wrapper and error shape (webhookapi.WriteKnownError
// first). Their store (app.Service.WebhookEndpoints) holds URLs to the
// merchants' webhook URL policy and seals secrets with the service's key. Each key gets a token bucket
// ([RateLimit]); an empty one is a 429 with Retry-After. Checks fail
// closed: a request without a key in its context is no one's, not an
// admin's.
//
// Errors are {"error": {"code", "message", "field"}} with a fitting status:
// 400 for a body that is not JSON or has an unknown or mistyped field, 404
// for an unknown id, 409 for a transition the payment's status does not
// allow, 413 for a body over 1 MiB, 422 for a value that is well-formed but
// invalid (a zero amount, an unknown currency, a webhook URL that is not
// https or points at a private address) and for an Idempotency-Key
// reused with another request. A rejected request changes nothing.
//
// Bodies go through one strict decoder ([strictjson.Check], then encoding/json
// refusing unknown fields): a key given twice or in another case, invalid
// UTF-8 and lone surrogate escapes are 400, so that no other reader of the
// body (a proxy, a log) can read it differently from the service.
//
// Every POST honours an Idempotency-Key header, scoped to the API key that
// sent it. The key is stored in the same database transaction as the
// command's effect, together with the response (less anything shown once,
// such as a new API key); a retry with the same key and the same request
// gets that response back (with Idempotent-Replayed: true) and has no
// second effect.
// Two concurrent requests with one key serialize on the key's row, so the
// second waits for the first and then replays it. [KeyExpiry] deletes keys
// older than a TTL (24h by default, as Stripe does); a request whose key
// has expired runs as a new one.
// A response that shows a secret once (a merchant's creation, a webhook
// secret's rotation, a webhook endpoint's creation or rotation: a
// webhookapi.ShownOncer) is stored, and replayed, without that secret.
//
// Request bodies and responses are never logged: a merchant's response holds
// its webhook secret and its API key.
package httpapi
