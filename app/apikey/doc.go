// Package apikey issues, checks and revokes the API keys of the payments
// service's HTTP API.
//
// A key is "ofk_" and 43 characters of base64url: 256 random bits. It is
// returned once, by [Create]; the database keeps its SHA-256 only. A fast,
// unsalted hash is enough here because the keys are high-entropy: there is
// no dictionary to try, and 2^256 guesses are out of reach, so a slow
// password hash would cost every request time and buy nothing. For the same
// reason the lookup by hash needs no constant-time comparison: what timing
// could reveal is a prefix of a hash, which says nothing about any key.
//
// A key with no merchant is an admin key; a merchant's key acts for that
// merchant only (package httpapi enforces it). Keys are revoked, never
// deleted, so that what they did stays attributable.
package apikey
