// Package console is the reference binary's operator console: a web UI
// served by `outflow console` (or the console role of `outflow serve`) that
// shows the outbox, the forwarder's partitions, the consumers and the
// webhooks, follows one aggregate's events through every table, and retries
// or discards what is parked.
//
// It is server-rendered (html/template) with embedded static assets: no
// build step. Every page needs a session, which a login with an admin API
// key opens; every POST carries the session's CSRF token; every action is
// recorded in the operators' audit (the framework's
// outflow_operator_actions, package actionlog), with the outflow CLI's,
// which the Actions page lists. [Console.Run] samples the published total
// for the overview's rate; New starts nothing.
//
// Those tables (api_keys, console_sessions) and the webhooks' are the
// reference app's. On the database of another service
// built on the framework, which has none of them, [Config].FrameworkOnly
// serves the framework's pages alone: an operator key (its SHA-256 given
// to the process) logs in, sessions live in the process's memory, actions
// are recorded in the same audit as the operator key's, and the app's
// parts say "not installed".
package console
