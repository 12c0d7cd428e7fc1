// Package schema holds the webhook delivery tables as a migration set of
// their own ([Set]), applied after the framework's set and before the
// service's (which may reference them, as the reference app's migration
// of its one-URL merchants does):
//
//	migrations.UpSetsPool(ctx, pool, migrations.Config{}, migrations.Framework(), schema.Set(), mysvc.Set())
//
// The tables: webhook_endpoints (several per account), webhook_messages
// (one per event an account's endpoints want), webhook_endpoint_deliveries
// (one per message and matching endpoint: the sender's queue) and
// webhook_endpoint_attempts (every HTTP attempt, with a bounded, redacted
// response body). An account is the service's own notion (a merchant id in
// the reference app), kept as text.
package schema
