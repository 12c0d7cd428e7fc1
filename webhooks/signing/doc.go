// Package signing signs and verifies webhooks the Standard Webhooks way
// (https://www.standardwebhooks.com): a "whsec_" secret, the headers
// webhook-id, webhook-timestamp and webhook-signature, the latter a
// space-separated list of "v1,<base64 HMAC-SHA256 of id.timestamp.body>"
// (one per secret while a rotated-out secret is still in its grace
// period).
//
// It is a few lines of the standard library's HMAC rather than the
// standardwebhooks library: that library verifies only, and what a sender
// needs (signing with several secrets at once) is not in it.
package signing
