// Package healthrules holds Outflow's alert rules as Go values, and
// evaluates them on what a reader of the database saw over time: the
// operator console's status line (healthy, degraded, failing) comes from
// here, so that it says what the shipped alerts of
// deploy/observability/prometheus-rules.yml would say. A test parses that
// file and fails when an alert's name, query, threshold, duration or
// severity differs from its rule here: the two cannot drift apart.
//
// The alerts are computed by Prometheus from metrics; this package
// computes the same conditions from snapshots of the tables and the
// broker's lag, taken by the console every few seconds. What that changes
// is said on each rule: rates and increases are computed from the
// console's own snapshots (so over the part of the window it has seen),
// and a rule's `for:` is not waited for: a condition shows at once, with
// how long the snapshots show it has held beside the alert's duration.
package healthrules
