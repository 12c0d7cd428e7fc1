package healthrules_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/healthrules"
)

func TestEvaluate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(min float64) time.Time { return t0.Add(time.Duration(min * float64(time.Minute))) }
	outbox := func(min float64, ageMin float64, parked int64) healthrules.Snapshot {
		return healthrules.Snapshot{At: at(min), Outbox: &healthrules.Outbox{
			OldestPendingAge: time.Duration(ageMin * float64(time.Minute)), Parked: parked}}
	}
	consumer := func(min float64, events int64, oldestMin float64, dead int64) healthrules.Snapshot {
		return healthrules.Snapshot{At: at(min), Consumers: []healthrules.Consumer{{Name: "analytics", Topic: "payments",
			Lag: &healthrules.Lag{Events: events, OldestAge: time.Duration(oldestMin * float64(time.Minute))}, Dead: dead, DeadKnown: true}}}
	}
	hooks := func(min float64, dead, attempts, failed int64) healthrules.Snapshot {
		return healthrules.Snapshot{At: at(min), Webhooks: &healthrules.Webhooks{Dead: dead, Attempts: attempts,
			FailedAttempts: failed, AttemptsKnown: true}}
	}
	type want struct {
		alert    string
		value    float64
		held     time.Duration
		covered  time.Duration
		consumer string
	}
	for _, tc := range []struct {
		name  string
		snaps []healthrules.Snapshot
		state healthrules.Severity
		want  []want
	}{
		{name: "nothing read", state: healthrules.Healthy},
		{name: "all well", snaps: []healthrules.Snapshot{outbox(0, 0.1, 0), outbox(1, 0.2, 0)}, state: healthrules.Healthy},
		{name: "outbox stuck at the threshold is not stuck", snaps: []healthrules.Snapshot{outbox(0, 5, 0)}, state: healthrules.Healthy},
		{name: "outbox stuck: page, held since the first snapshot over 5 min",
			snaps: []healthrules.Snapshot{outbox(0, 4, 0), outbox(1, 5.5, 0), outbox(3, 7.5, 0)},
			state: healthrules.Failing, want: []want{{alert: "OutflowOutboxStuck", value: 450, held: 2 * time.Minute}}},
		{name: "parked: ticket, held only now", snaps: []healthrules.Snapshot{outbox(0, 0, 0), outbox(1, 0, 34)},
			state: healthrules.Degraded, want: []want{{alert: "OutflowOutboxParked", value: 34}}},
		{name: "a page is graver than a ticket, listed first",
			snaps: []healthrules.Snapshot{outbox(0, 6, 2)},
			state: healthrules.Failing, want: []want{{alert: "OutflowOutboxStuck", value: 360}, {alert: "OutflowOutboxParked", value: 2}}},
		{name: "consumer lagging by age (page) and backlog (ticket)",
			snaps: []healthrules.Snapshot{consumer(0, 20000, 6, 0), consumer(10, 20001, 16, 0)},
			state: healthrules.Failing, want: []want{
				{alert: "OutflowConsumerLagging", value: 960, held: 10 * time.Minute, consumer: "analytics"},
				{alert: "OutflowConsumerBacklog", value: 20001, held: 10 * time.Minute, consumer: "analytics"}}},
		{name: "a lag without age (amqp) is no lagging", snaps: []healthrules.Snapshot{consumer(0, 5, 0, 0)}, state: healthrules.Healthy},
		{name: "dead letters: rises within 15 min (the one at 10 min of 20), a retry (fall) adds nothing",
			snaps: []healthrules.Snapshot{consumer(0, 0, 0, 50), consumer(10, 0, 0, 52), consumer(12, 0, 0, 40), consumer(20, 0, 0, 43)},
			state: healthrules.Degraded, want: []want{{alert: "OutflowConsumerDeadLetters", value: 3, covered: 10 * time.Minute, consumer: "analytics"}}},
		{name: "dead letters older than 15 min are over",
			snaps: []healthrules.Snapshot{consumer(0, 0, 0, 1), consumer(1, 0, 0, 3), consumer(20, 0, 0, 3)}, state: healthrules.Healthy},
		{name: "webhook dead within 15 min", snaps: []healthrules.Snapshot{hooks(0, 3, 0, 0), hooks(5, 4, 0, 0)},
			state: healthrules.Degraded, want: []want{{alert: "OutflowWebhookDead", value: 1, covered: 5 * time.Minute}}},
		{name: "webhook failure ratio over 10 min, held while above",
			snaps: []healthrules.Snapshot{hooks(0, 0, 0, 0), hooks(2, 0, 100, 10), hooks(4, 0, 200, 60), hooks(6, 0, 300, 110)},
			state: healthrules.Degraded, want: []want{{alert: "OutflowWebhookFailureRate", value: 110.0 / 300, held: 2 * time.Minute,
				covered: 6 * time.Minute}}},
		{name: "webhook failure ratio without attempts says nothing",
			snaps: []healthrules.Snapshot{hooks(0, 0, 100, 90), hooks(2, 0, 100, 90)}, state: healthrules.Healthy},
		{name: "webhook failure ratio at 20% is not over",
			snaps: []healthrules.Snapshot{hooks(0, 0, 0, 0), hooks(2, 0, 100, 20)}, state: healthrules.Healthy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := healthrules.Evaluate(tc.snaps)
			require.Equal(t, tc.state, st.State)
			var got []want
			for _, f := range st.Findings {
				got = append(got, want{alert: f.Rule.Alert, value: f.Value, held: f.Held, covered: f.Covered, consumer: f.Consumer})
			}
			require.Equal(t, tc.want, got)
		})
	}
}
