// Package appmigrations holds the reference payments service's own schema
// (merchants, payments, the ledger, the HTTP API's keys and idempotency
// keys, the analytics projection and the webhook deliveries), a migration
// set of its own beside the framework's (package migrations), recorded in
// app_schema_migrations.
//
// Apply the framework's set first, then this one; `outflow migrate up --set app` does
// both. The versions keep the numbers they had when both sets were one
// (00002, 00003, 00006, 00007, 00009), so a database migrated by such a
// release adopts them on its next run instead of running them again.
package appmigrations
