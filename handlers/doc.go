// Package handlers holds the reference payments service's consumers,
// written as [consumer.Handler]s and run by a [consumer.Worker]: one user of
// the framework among others.
//
// Reference handlers: [SyncAnalytics] keeps a per-merchant projection;
// [NotifyMerchant] sends merchants their paid and refunded payments through
// the webhook package (webhooks/fanout records a message per event and a
// delivery per endpoint of the merchant; webhooks/sender sends them).
//
// The rollout from the previous release's one-URL webhooks: [RunHandOver],
// beside the webhook package's sender, moves the legacy deliveries still
// pending and not in flight to its tables ([HandOver]) while processes of
// an earlier release may still write or send them. The previous release's
// [Sender] is kept, deprecated, for the rollout's tests only.
package handlers
