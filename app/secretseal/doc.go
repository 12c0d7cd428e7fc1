// Package secretseal encrypts the reference service's webhook secrets at
// rest: AES-256-GCM under an operator-supplied key (OUTFLOW_SECRET_KEY),
// the merchant's id as associated data, so a sealed secret copied onto
// another merchant's row does not open.
//
// A stored secret is either sealed, "enc:v1:<key id>:<base64 of nonce and
// ciphertext>", or, as before sealing existed, the plaintext "whsec_..."
// itself: [Open] reads both, so rows written before the key was set keep
// working until they are sealed (`outflow webhook-secrets seal`). The key
// id (8 hex digits derived from the key, not secret) lets [Open] say that
// a row was sealed with another key rather than merely fail.
package secretseal
