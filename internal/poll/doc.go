// Package poll is Outflow's one periodic runner: every recurring job of
// the product runs on [Every], [Drain] or [DrainOrWake]. One order, work
// first: a job's first round runs as it starts, not an interval later. A
// round's error goes to onErr (usually [Warn]) unless the context ended.
// [Until] is the one wait for a condition.
package poll
