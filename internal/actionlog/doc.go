// Package actionlog is the audit of what operators do: one row of
// outflow_operator_actions (framework migration 00031) for each action of
// the console and each command of the outflow tool that changes state,
// with who did it (an API key, the console's operator key, or the OS user
// at a host with the command line), when, what, on which rows or filter,
// how many rows it changed, and its error if it failed.
//
// It exists so that every way an operator changes the pipeline leaves the
// same trace, read in one place (the console's Actions page, and the
// journey of an aggregate for its replays): before it, the console wrote
// the reference app's console_actions, a FrameworkOnly console only its
// log, and the tool nothing at all.
//
// [Do] runs a change and the insert of its record in one transaction: both
// commit, or neither does; a change that fails is rolled back and recorded
// alone, with its error. What cannot be part of a database transaction (a
// replay published to a broker) is recorded with [Insert] once done,
// failed or not. Secrets never go into a record: the caller gives the
// target and the command line, and the tool masks its secrets with package
// redact before.
package actionlog
