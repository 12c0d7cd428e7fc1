// Package console is the reference binary's operator console: a web UI
// served by `outflow console` (or the console role of `outflow serve`) that
// shows the outbox, the forwarder's partitions, the consumers and the
// webhooks, follows one aggregate's events through every table, and retries
// or discards what is parked.
//
// It is server-rendered (html/template) with embedded static assets: no
// build step. Every page needs a session, which a login with an admin API
// key opens; every POST carries the session's CSRF token; every action is
// recorded in console_actions. [Console.Run] samples the published total
// for the overview's rate; New starts nothing.
package console
