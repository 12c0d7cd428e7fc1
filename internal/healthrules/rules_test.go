package healthrules_test

import (
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outflow-dev/outflow/internal/healthrules"
)

// exprRe splits an alert's expression into its query and threshold: the
// rules file keeps every expression as "<query> > <number>".
var exprRe = regexp.MustCompile(`(?s)^(.*\S)\s*>\s*([0-9.eE+-]+)\s*$`)

// The rules here are the shipped alerts: every alert of
// prometheus-rules.yml has a rule of the same name, query, threshold,
// duration and severity, and every rule an alert. Changing one without the
// other fails here, so the console's status line cannot drift from what
// the alerts page and ticket on.
func TestRulesAreTheShippedAlerts(t *testing.T) {
	b, err := os.ReadFile("../../deploy/observability/prometheus-rules.yml")
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `yaml:"alert"`
				Expr   string            `yaml:"expr"`
				For    string            `yaml:"for"`
				Labels map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &file))
	var alerts []healthrules.Rule
	for _, g := range file.Groups {
		for _, a := range g.Rules {
			m := exprRe.FindStringSubmatch(a.Expr)
			require.NotNil(t, m, "%s: the expression is not `<query> > <number>`: %s", a.Alert, a.Expr)
			threshold, err := strconv.ParseFloat(m[2], 64)
			require.NoError(t, err, a.Alert)
			var d time.Duration
			if a.For != "" {
				d, err = time.ParseDuration(a.For)
				require.NoError(t, err, a.Alert)
			}
			alerts = append(alerts, healthrules.Rule{Alert: a.Alert, Query: m[1], Threshold: threshold, For: d,
				Severity: a.Labels["severity"]})
		}
	}
	require.NotEmpty(t, alerts)
	var rules []healthrules.Rule
	for _, r := range healthrules.All {
		r.Window = 0 // not in the file as a field: it is the query's range, checked below
		rules = append(rules, r)
	}
	require.Equal(t, alerts, rules, "healthrules.All must be the alerts of prometheus-rules.yml, in its order")
	// A rule's window is its query's range.
	rangeRe := regexp.MustCompile(`\[(\w+)\]`)
	for _, r := range healthrules.All {
		m := rangeRe.FindStringSubmatch(r.Query)
		if m == nil {
			require.Zero(t, r.Window, r.Alert)
			continue
		}
		d, err := time.ParseDuration(m[1])
		require.NoError(t, err, r.Alert)
		require.Equal(t, d, r.Window, "%s: Window is its query's range", r.Alert)
	}
}
