package console

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outflow-dev/outflow/internal/healthrules"
)

// statusLine is the overview's first line: the state by the health rules
// (those of the shipped alerts, internal/healthrules), and why.
type statusLine struct {
	State string // healthy, degraded or failing
	Why   []reason
}

type reason struct {
	State string // the reason's own: degraded or failing
	Text  string
}

// statusLine words st for the overview. A panel that could not be read
// makes the state at least degraded: the rules cannot say it is well.
func (c *Console) statusLine(st healthrules.Status, unavailable map[string]string) statusLine {
	l := statusLine{State: st.State.String()}
	for _, f := range st.Findings {
		l.Why = append(l.Why, reason{State: f.State().String(), Text: findingText(f)})
	}
	panels := make([]string, 0, len(unavailable))
	for p := range unavailable {
		panels = append(panels, p)
	}
	slices.Sort(panels)
	for _, p := range panels {
		l.Why = append(l.Why, reason{State: healthrules.Degraded.String(),
			Text: fmt.Sprintf("%s not read: %s, so its rules are not evaluated", p, unavailable[p])})
	}
	if len(panels) > 0 && st.State < healthrules.Degraded {
		l.State = healthrules.Degraded.String()
	}
	return l
}

// findingText is one reason of the status line: what holds, against the
// alert's threshold and name, and for how long the samples show it.
func findingText(f healthrules.Finding) string {
	r := f.Rule
	var what, threshold string
	switch r.Alert {
	case healthrules.OutboxStuck.Alert:
		what, threshold = "outbox oldest pending "+coarse(seconds(f.Value)), coarse(seconds(r.Threshold))
	case healthrules.OutboxParked.Alert:
		what, threshold = plural(int64(f.Value), "outbox row parked", "outbox rows parked"), thousands(int64(r.Threshold))
	case healthrules.ConsumerDeadLetters.Alert:
		what, threshold = fmt.Sprintf("%s of %s in the last %s", plural(int64(f.Value), "new dead letter", "new dead letters"), f.Consumer,
			coarse(r.Window)), thousands(int64(r.Threshold))
	case healthrules.ConsumerLagging.Alert:
		what, threshold = fmt.Sprintf("%s oldest unhandled event %s", consumerName(f), coarse(seconds(f.Value))), coarse(seconds(r.Threshold))
	case healthrules.ConsumerBacklog.Alert:
		what, threshold = fmt.Sprintf("%s lags %s events", consumerName(f), thousands(int64(f.Value))), thousands(int64(r.Threshold))
	case healthrules.WebhookFailureRate.Alert:
		what = fmt.Sprintf("%.0f%% of webhook attempts failed in the last %s (%s of %s)", f.Value*100, coarse(r.Window),
			thousands(f.Failed), thousands(f.Attempts))
		threshold = fmt.Sprintf("%.0f%%", r.Threshold*100)
	case healthrules.WebhookDead.Alert:
		what, threshold = fmt.Sprintf("%s in the last %s", plural(int64(f.Value), "webhook delivery dead", "webhook deliveries dead"), coarse(r.Window)),
			thousands(int64(r.Threshold))
	default:
		what, threshold = fmt.Sprintf("%s is %g", r.Query, f.Value), fmt.Sprint(r.Threshold)
	}
	notes := []string{r.Alert}
	if r.Window > 0 {
		n := "from the console's samples"
		if f.Covered < r.Window {
			n += " of the last " + coarse(f.Covered)
		}
		notes = append(notes, n)
	}
	switch {
	case r.For == 0:
	case f.Held >= r.For:
		notes = append(notes, "for "+coarse(f.Held))
	case f.Held > 0:
		notes = append(notes, fmt.Sprintf("for %s, the alert waits %s", coarse(f.Held), coarse(r.For)))
	default:
		notes = append(notes, "just now, the alert waits "+coarse(r.For))
	}
	return fmt.Sprintf("%s (> %s, %s)", what, threshold, strings.Join(notes, "; "))
}

func consumerName(f healthrules.Finding) string {
	if f.Topic == "" {
		return f.Consumer
	}
	return f.Consumer + " (" + f.Topic + ")"
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
