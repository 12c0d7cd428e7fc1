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
// Those tables (api_keys, console_sessions) are the reference app's. On
// the database of another service built on the framework, which has none
// of them, [Config].FrameworkOnly serves the framework's pages alone: an
// operator key (its SHA-256 given to the process) logs in, sessions live
// in the process's memory, and actions are recorded in the same audit as
// the operator key's.
//
// The webhooks are the framework's (package webhooks and its migration
// set): shown, and acted on through the webhooks packages, in either mode
// when the set is installed (the console looks for its tables), "not
// installed" otherwise.
package console
