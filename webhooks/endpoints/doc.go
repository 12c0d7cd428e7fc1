// Package endpoints keeps an account's webhook endpoints: where its events
// go, which types each wants, how fast it may be called, the payload
// version it was made for, whether it is enabled, and the secret its
// requests are signed with.
//
// Every method takes the caller's [webhooks.DB] (a pool, or the
// transaction of the command it is part of: an API's Idempotency-Key
// record then commits with the change) and the account the caller acts
// for. An endpoint is named by its id and that account together, so an
// endpoint of another account is [webhooks.ErrNotFound], exactly as one
// that does not exist: an account learns nothing of another's. Bad input
// is a *[webhooks.ValidationError] naming the JSON field, checked before
// any statement runs, so it changes nothing.
//
// Why the pieces are the way they are:
//
//   - The URL is checked with the SSRF policy of [netguard.Policy.CheckURL]
//     when stored (https, no address literal that is not public, no
//     credentials); the sender checks where a name leads at every
//     connection, since DNS can change after the check.
//   - A signing secret is returned once, by Create and RotateSecret, and
//     never again: [Endpoint] has no field for it. With a key it is sealed
//     at rest (see [github.com/outflow-dev/outflow/webhooks/secretseal])
//     with the endpoint's id as associated data, so a sealed value copied
//     onto another endpoint's row does not open. A rotation keeps the
//     replaced secret, as stored, for a grace period: the sender signs
//     with both, and the account switches its verification without losing
//     a webhook. [SealSecrets] seals the secrets written before a key was
//     set.
//   - Disabling fails the endpoint's pending deliveries at once: a
//     disabled endpoint must take none of the sender's capacity. Enabling
//     clears the health record (failing run, circuit) but resends nothing:
//     what failed meanwhile is sent again by recovery, a separate request,
//     so that the account chooses from when.
//   - Create takes an advisory lock on the account for the transaction, so
//     that Config.MaxPerAccount holds under concurrent creations.
//   - Ids are UUIDv7: an account's endpoints list in creation order from
//     the primary key's order too.
package endpoints
