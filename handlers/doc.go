// Package handlers holds the reference payments service's consumers,
// written as [consumer.Handler]s and run by a [consumer.Worker]: one user of
// the framework among others.
//
// Reference handlers: [SyncAnalytics] keeps a per-merchant projection;
// [NotifyMerchant] records a Standard Webhooks delivery per paid or refunded
// payment, which a [Sender] sends (concurrently, bounded per merchant, under
// fenced leases, redirects never followed, every connection checked
// against private destinations; see its doc), woken through
// Committed. [PurgeWebhooks] removes settled deliveries after the
// retention. With NotifyConfig.Registerer the Sender exports Prometheus
// metrics ([MetricWebhookAttempts] and the others); the table gauges come
// from one Sender at a time.
//
// The framework's webhook package (webhooks/) takes these deliveries over:
// [RunHandOver], beside its sender, moves the legacy deliveries still
// pending and not in flight to its tables ([HandOver]) while processes of
// an earlier release may still write or send them.
package handlers
