// Package webhooks delivers a service's events to its accounts' HTTP
// endpoints, the way dedicated webhook services do: several endpoints per
// account, each with its event-type filter, signing secret (rotated with a
// grace period), rate limit and pinned payload version; one message per
// event fanned out to the endpoints that want it; a retry schedule over
// about three days; a circuit per endpoint, and an endpoint failing for
// days disabled with a notice to the account's other endpoints; every
// attempt recorded, with a bounded, redacted response body; resend,
// recovery since a time and test events.
//
// The pieces, each a package:
//
//   - [github.com/outflow-dev/outflow/webhooks/schema]: the tables, a
//     migration set of their own;
//   - [github.com/outflow-dev/outflow/webhooks/endpoints]: endpoints' CRUD
//     and secrets;
//   - [github.com/outflow-dev/outflow/webhooks/fanout]: the consumer
//     handler that records one message per event and a delivery per
//     matching endpoint, in the handler's transaction;
//   - [github.com/outflow-dev/outflow/webhooks/sender]: the HTTP calls,
//     outside any transaction: leases, schedule, circuit, disabling, SSRF
//     guard, Standard Webhooks signatures;
//   - [github.com/outflow-dev/outflow/webhooks/deliveries]: what was sent
//     and how it went, resend, recovery, test events, retention;
//   - [github.com/outflow-dev/outflow/webhooks/webhookapi]: HTTP handlers a
//     service mounts under its own authentication;
//   - [github.com/outflow-dev/outflow/webhooks/signing] and
//     [github.com/outflow-dev/outflow/webhooks/secretseal]: signatures,
//     and secrets sealed at rest.
//
// This package holds what they share: the [Message] and how it is
// rendered for an endpoint ([Renderer]).
package webhooks
