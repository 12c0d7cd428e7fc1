// Package layering holds the test that keeps the framework apart from the
// reference application: no framework package (events, events/outbox,
// forwarder, consumer, idempotency, migrations, outflowtest, replay, the brokers and
// every package under them), nor its tests, may reach the reference
// payments service (app, handlers) or the binaries' code (cmd, whose
// internals live with each binary: cmd/outflow/internal/cli, demo, config;
// cmd/outflow-bench/internal/bench). A user who imports the framework links
// none of it. It has no code of its own.
package layering
