// Package secretseal encrypts webhook signing secrets at rest: AES-256-GCM
// under an operator-supplied key (OUTFLOW_SECRET_KEY), the owner's id (an
// endpoint's, or in the reference app a merchant's) as associated data, so
// a sealed secret copied onto another row does not open.
//
// A stored secret is either sealed, "enc:v1:<key id>:<base64 of nonce and
// ciphertext>", or, as before sealing existed, the plaintext "whsec_..."
// itself: [Open] reads both, so rows written before the key was set keep
// working until they are sealed (`outflow webhook-secrets seal`). The key
// id (8 hex digits derived from the key, not secret) lets [Open] say that
// a row was sealed with another key rather than merely fail.
//
// It is our own code rather than a library's because what it needs is
// small (one AEAD from the standard library, a versioned text form, the
// key id) and every secret manager library would bring a service to run.
package secretseal
