// Package appmigrations holds the reference payments service's own schema
// (merchants, payments, the ledger, the HTTP API's keys and idempotency
// keys, the analytics projection and the webhook deliveries), a migration
// set of its own beside the framework's (package migrations), recorded in
// app_schema_migrations.
//
// Apply the framework's set first, then the webhook package's
// (webhooks/schema), then this one: [Sets] lists the last two in order, and
// `outflow migrate up --set app` applies all three. 00034 builds on the
// webhook package's tables: each merchant's webhook_url becomes an
// endpoint whose id is the merchant's (so secrets sealed with the merchant
// id open as the endpoint's), kept in step by a trigger while API
// processes of an earlier release still write merchants, and lets a legacy
// delivery be 'moved' (handed over by handlers.HandOver). The versions keep the numbers they had when both sets were one
// (00002, 00003, 00006, 00007, 00009), so a database migrated by such a
// release adopts them on its next run instead of running them again.
package appmigrations
