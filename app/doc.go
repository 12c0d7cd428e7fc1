// Package app is Outflow's reference service: a small payments service
// (merchants, payments with a state machine, a double-entry ledger) that
// shows the whole outbox pattern and that the tests and benchmarks drive.
//
// Every command is one database transaction that locks the payment row,
// checks the transition, bumps the version, writes balanced ledger entries
// and publishes its event through the outbox, so the state change and the
// event commit or roll back together. Because the row lock serializes the
// commands of one payment, the versions of its events are exactly 1, 2, 3,
// ... in commit order, which is what consumers order by.
//
// Each command comes as a pair: Pay runs in a transaction of its own, PayTx
// in the caller's, so that callers (the HTTP API's Idempotency-Key, a user's
// own code) can compose their writes with ours. No HTTP or broker call is
// ever made inside these transactions.
//
// Its tables are its own migration set (package app/migrations), applied
// after the framework's and the webhook package's (webhooks/schema: its
// merchants' webhooks are endpoints there, app migration 00034);
// `outflow migrate up --set app` runs all three (without --set app, only
// the framework's).
package app
