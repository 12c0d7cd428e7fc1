package healthrules

import (
	"fmt"
	"time"
)

// Severity is the state a rule's condition puts the system in.
type Severity int

// The states, in order of gravity.
const (
	Healthy  Severity = iota
	Degraded          // a ticket alert's condition holds: someone should look today
	Failing           // a page alert's condition holds: someone should look now
)

func (s Severity) String() string {
	switch s {
	case Degraded:
		return "degraded"
	case Failing:
		return "failing"
	}
	return "healthy"
}

// Rule is one alert of prometheus-rules.yml: its expression is
// `Query > Threshold`, it fires after the condition held For, and its
// severity label is Severity ("page" or "ticket").
type Rule struct {
	Alert     string
	Query     string
	Threshold float64
	For       time.Duration
	Severity  string
	// Window is the range of the query's rate() or increase(), zero for a
	// gauge read as it is.
	Window time.Duration
}

// State is the severity the rule's condition puts the system in: failing
// for a page, degraded for a ticket.
func (r Rule) State() Severity {
	if r.Severity == "page" {
		return Failing
	}
	return Degraded
}

// The rules, one per alert of deploy/observability/prometheus-rules.yml.
var (
	// OutboxStuck: the oldest pending outbox row is older than 5 min.
	OutboxStuck = Rule{Alert: "OutflowOutboxStuck", Query: "max(outflow_outbox_oldest_pending_age_seconds)",
		Threshold: 300, For: 5 * time.Minute, Severity: "page"}
	// OutboxParked: outbox rows are parked.
	OutboxParked = Rule{Alert: "OutflowOutboxParked", Query: "max(outflow_outbox_parked)",
		Threshold: 0, For: 5 * time.Minute, Severity: "ticket"}
	// ConsumerDeadLetters: a consumer dead-lettered messages in the last
	// 15 min. The console counts the rises of each consumer's open dead
	// letters (status dead) between its snapshots: a message dead-lettered
	// and retried between two snapshots is not seen.
	ConsumerDeadLetters = Rule{Alert: "OutflowConsumerDeadLetters",
		Query:     "sum by (consumer, topic) (increase(outflow_consumer_dead_total[15m]))",
		Threshold: 0, Severity: "ticket", Window: 15 * time.Minute}
	// ConsumerLagging: a consumer's oldest unhandled event is older than
	// 5 min (known only where the broker tells the age: not amqp).
	ConsumerLagging = Rule{Alert: "OutflowConsumerLagging",
		Query:     "max by (consumer, topic) (outflow_consumer_oldest_unhandled_age_seconds)",
		Threshold: 300, For: 10 * time.Minute, Severity: "page"}
	// ConsumerBacklog: a consumer has more than 10,000 unhandled events.
	ConsumerBacklog = Rule{Alert: "OutflowConsumerBacklog", Query: "max by (consumer, topic) (outflow_consumer_lag_events)",
		Threshold: 10000, For: 10 * time.Minute, Severity: "ticket"}
	// WebhookFailureRate: more than 20% of the webhook attempts of the
	// last 10 min failed. The console counts the attempts recorded in
	// webhook_attempts between its snapshots.
	WebhookFailureRate = Rule{Alert: "OutflowWebhookFailureRate",
		Query:     `sum(rate(outflow_webhook_endpoint_attempts_total{outcome=~"retry|failed"}[10m])) / sum(rate(outflow_webhook_endpoint_attempts_total[10m]))`,
		Threshold: 0.2, For: 10 * time.Minute, Severity: "ticket", Window: 10 * time.Minute}
	// WebhookDead: webhook deliveries gave up in the last 15 min. The
	// console counts the rises of the dead deliveries between its
	// snapshots.
	WebhookDead = Rule{Alert: "OutflowWebhookDead", Query: `sum(increase(outflow_webhook_endpoint_attempts_total{outcome="failed"}[15m]))`,
		Threshold: 0, Severity: "ticket", Window: 15 * time.Minute}
)

// All are the rules, in the order of the rules file.
var All = []Rule{OutboxStuck, OutboxParked, ConsumerDeadLetters, ConsumerLagging, ConsumerBacklog, WebhookFailureRate, WebhookDead}

// Expr is the rule's expression as the rules file writes it.
func (r Rule) Expr() string { return fmt.Sprintf("%s > %v", r.Query, r.Threshold) }
