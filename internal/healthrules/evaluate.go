package healthrules

import (
	"cmp"
	"slices"
	"time"
)

// Snapshot is what a reader saw of the system at one time. A part it
// could not read (a read that failed or timed out, a table not
// installed) is nil, or its Known false: a rule says nothing of what was
// not read.
type Snapshot struct {
	At        time.Time
	Outbox    *Outbox
	Consumers []Consumer
	Webhooks  *Webhooks
}

// Outbox is the outbox's part of a snapshot.
type Outbox struct {
	OldestPendingAge time.Duration
	Parked           int64
}

// Consumer is one consumer's part of a snapshot.
type Consumer struct {
	Name, Topic string
	// Lag is nil when the broker could not tell it. Its OldestAge is zero
	// when the broker cannot tell ages (amqp).
	Lag *Lag
	// Dead counts the consumer's open dead letters of status dead, when
	// DeadKnown.
	Dead      int64
	DeadKnown bool
}

// Lag is a consumer's lag, as brokers.Lag.
type Lag struct {
	Events    int64
	OldestAge time.Duration
}

// Webhooks is the webhook deliveries' part of a snapshot.
type Webhooks struct {
	Failing, Dead int64
	// Attempts and FailedAttempts count the attempts recorded since the
	// reader started counting (ever growing, as a Prometheus counter), and
	// the failed ones among them (retried or dead, as the alert's outcomes
	// retry and dead). Known only when AttemptsKnown.
	Attempts, FailedAttempts int64
	AttemptsKnown            bool
}

// Finding is a rule whose condition holds in the newest snapshot.
type Finding struct {
	Rule Rule
	// Consumer and Topic name the consumer of a per-consumer rule.
	Consumer, Topic string
	// Value is the rule's query's value: seconds, rows, events, a ratio or
	// an increase.
	Value float64
	// Failed and Attempts are a failure ratio's terms.
	Failed, Attempts int64
	// Held is how long the snapshots show the condition holding up to the
	// newest (zero: in the newest only). A rule's For is not waited for.
	Held time.Duration
	// Covered is, for a rule over a window, how much of it the snapshots
	// cover: less than the window when they started later.
	Covered time.Duration
}

// State is the finding's severity.
func (f Finding) State() Severity { return f.Rule.State() }

// Status is the system's state by the rules: the gravest of its
// findings', healthy without one.
type Status struct {
	State    Severity
	Findings []Finding // gravest first, then in the rules' order
}

// point is a rule's value for one subject (a consumer, or "" for the
// system) at one snapshot.
type point struct {
	consumer, topic  string
	value            float64
	failed, attempts int64
	covered          time.Duration
}

// Evaluate applies every rule to snaps, oldest first: the newest is now,
// the others are the history that rates, increases and how long a
// condition held are computed from.
func Evaluate(snaps []Snapshot) Status {
	var st Status
	if len(snaps) == 0 {
		return st
	}
	last := len(snaps) - 1
	for _, r := range All {
		var found []Finding
		for _, p := range values(r, snaps, last) {
			if p.value > r.Threshold {
				found = append(found, Finding{Rule: r, Consumer: p.consumer, Topic: p.topic, Value: p.value, Failed: p.failed,
					Attempts: p.attempts, Covered: p.covered})
			}
		}
		if r.For > 0 && len(found) > 0 {
			subjects := make([]string, len(found))
			for i, f := range found {
				subjects[i] = f.Consumer
			}
			since := held(r, snaps, subjects)
			for i := range found {
				found[i].Held = since[found[i].Consumer]
			}
		}
		st.Findings = append(st.Findings, found...)
	}
	order := map[string]int{}
	for i, r := range All {
		order[r.Alert] = i
	}
	slices.SortStableFunc(st.Findings, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(b.State(), a.State()), cmp.Compare(order[a.Rule.Alert], order[b.Rule.Alert]),
			cmp.Compare(a.Consumer, b.Consumer))
	})
	if len(st.Findings) > 0 {
		st.State = st.Findings[0].State()
	}
	return st
}

// held is how long, up to the newest snapshot, r's condition held for
// each subject (a consumer, or "" for the system) in every snapshot: from
// the oldest of the run of snapshots that ends with the newest. One walk
// back for all the subjects, which ends when none holds any more.
func held(r Rule, snaps []Snapshot, subjects []string) map[string]time.Duration {
	last := len(snaps) - 1
	from := make(map[string]int, len(subjects))
	alive := make(map[string]bool, len(subjects))
	for _, s := range subjects {
		from[s], alive[s] = last, true
	}
	holding := map[string]bool{}
	for i := last - 1; i >= 0 && len(alive) > 0; i-- {
		clear(holding)
		for _, p := range values(r, snaps, i) {
			if p.value > r.Threshold {
				holding[p.consumer] = true
			}
		}
		for s := range alive {
			if holding[s] {
				from[s] = i
			} else {
				delete(alive, s)
			}
		}
	}
	out := make(map[string]time.Duration, len(from))
	for s, i := range from {
		out[s] = snaps[last].At.Sub(snaps[i].At)
	}
	return out
}

// values are r's query's values at snaps[i], one per subject it can tell.
func values(r Rule, snaps []Snapshot, i int) []point {
	s := snaps[i]
	switch r.Alert {
	case OutboxStuck.Alert:
		if s.Outbox != nil {
			return []point{{value: s.Outbox.OldestPendingAge.Seconds()}}
		}
	case OutboxParked.Alert:
		if s.Outbox != nil {
			return []point{{value: float64(s.Outbox.Parked)}}
		}
	case ConsumerLagging.Alert, ConsumerBacklog.Alert:
		out := make([]point, 0, len(s.Consumers))
		for _, c := range s.Consumers {
			switch {
			case c.Lag == nil:
			case r.Alert == ConsumerBacklog.Alert:
				out = append(out, point{consumer: c.Name, topic: c.Topic, value: float64(c.Lag.Events)})
			case c.Lag.OldestAge > 0: // zero: not told (amqp), or nothing waits
				out = append(out, point{consumer: c.Name, topic: c.Topic, value: c.Lag.OldestAge.Seconds()})
			}
		}
		return out
	case ConsumerDeadLetters.Alert:
		from := windowStart(r, snaps, i)
		out := make([]point, 0, len(s.Consumers))
		for _, c := range s.Consumers {
			if !c.DeadKnown {
				continue
			}
			rise := rises(snaps[from:i+1], func(s Snapshot) (int64, bool) {
				for _, o := range s.Consumers {
					if o.Name == c.Name {
						return o.Dead, o.DeadKnown
					}
				}
				return 0, false
			})
			out = append(out, point{consumer: c.Name, topic: c.Topic, value: float64(rise), covered: s.At.Sub(snaps[from].At)})
		}
		return out
	case WebhookDead.Alert:
		if s.Webhooks == nil {
			return nil
		}
		from := windowStart(r, snaps, i)
		rise := rises(snaps[from:i+1], func(s Snapshot) (int64, bool) {
			if s.Webhooks == nil {
				return 0, false
			}
			return s.Webhooks.Dead, true
		})
		return []point{{value: float64(rise), covered: s.At.Sub(snaps[from].At)}}
	case WebhookFailureRate.Alert:
		// The counters of the oldest and the newest snapshot of the window
		// that counted attempts.
		first, newest := -1, -1
		for j := windowStart(r, snaps, i); j <= i; j++ {
			if w := snaps[j].Webhooks; w != nil && w.AttemptsKnown {
				if first < 0 {
					first = j
				}
				newest = j
			}
		}
		if first < 0 || first == newest {
			return nil
		}
		a, b := snaps[first].Webhooks, snaps[newest].Webhooks
		attempts, failed := b.Attempts-a.Attempts, b.FailedAttempts-a.FailedAttempts
		if attempts <= 0 { // no attempt: no ratio, as rate()/rate() is NaN
			return nil
		}
		return []point{{value: float64(failed) / float64(attempts), failed: failed, attempts: attempts,
			covered: snaps[newest].At.Sub(snaps[first].At)}}
	}
	return nil
}

// windowStart is the index of the oldest snapshot within r's window of
// snaps[i].
func windowStart(r Rule, snaps []Snapshot, i int) int {
	j := i
	for j > 0 && snaps[i].At.Sub(snaps[j-1].At) <= r.Window {
		j--
	}
	return j
}

// rises sums the rises of a count from one snapshot to the next where
// both know it, as increase() sums a counter's: a count that went down
// (dead letters retried, deliveries purged) adds nothing.
func rises(snaps []Snapshot, count func(Snapshot) (int64, bool)) int64 {
	var (
		sum  int64
		prev int64
		ok   bool
	)
	for _, s := range snaps {
		n, known := count(s)
		if known && ok && n > prev {
			sum += n - prev
		}
		if known {
			prev, ok = n, true
		}
	}
	return sum
}
