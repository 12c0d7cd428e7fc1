package idempotency

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
)

// decide on the claim statement's results, Strict unless said: what the
// statement wrote (prev before, stored after) and whether the aggregate is
// marked reset. A reset aggregate at version 0 never takes a baseline: its
// early version is a gap, not a message blocked by a dead letter, and the
// verdict says it waits after a reset; once anything applied, the mark no
// longer matters.
func TestDecide(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name                  string
		fresh, latestWins     bool
		baseline, reset       bool
		prev, stored, version int64
		want                  outcome
		afterReset            bool
	}{
		{name: "next version", fresh: true, prev: 1, stored: 2, version: 2, want: applied},
		{name: "duplicate", prev: 2, stored: 2, version: 2, want: duplicate},
		{name: "duplicate: the version applied last", fresh: true, prev: 2, stored: 2, version: 2, want: duplicate},
		{name: "duplicate: the version applied last, latest wins", fresh: true, latestWins: true, prev: 2, stored: 2, version: 2, want: duplicate},
		{name: "older version", fresh: true, prev: 3, stored: 3, version: 2, want: stale},
		{name: "early version", fresh: true, prev: 1, stored: 1, version: 3, want: gap},
		{name: "next version behind a dead letter", fresh: true, prev: 1, stored: 1, version: 2, want: held},
		{name: "version 1 of an unseen aggregate", fresh: true, version: 1, stored: 1, want: applied},
		{name: "baseline taken", fresh: true, baseline: true, stored: 5, version: 5, want: applied},
		{name: "baseline behind a dead letter", fresh: true, baseline: true, version: 5, want: held},
		{name: "early version, no baseline", fresh: true, version: 5, want: gap},
		{name: "reset: baseline refused", fresh: true, baseline: true, reset: true, version: 5, want: gap, afterReset: true},
		{name: "reset: early version", fresh: true, reset: true, version: 3, want: gap, afterReset: true},
		{name: "reset: version 1 applies", fresh: true, baseline: true, reset: true, stored: 1, version: 1, want: applied},
		{name: "reset: version 1 behind a dead letter", fresh: true, reset: true, version: 1, want: held, afterReset: true},
		{name: "reset: duplicate", baseline: true, reset: true, version: 2, want: duplicate, afterReset: true},
		{name: "reset, then applied: a gap as any", fresh: true, baseline: true, reset: true, prev: 2, stored: 2, version: 4, want: gap},
		{name: "reset, then applied: stale", fresh: true, reset: true, prev: 2, stored: 2, version: 1, want: stale},
		{name: "latest wins after a reset", fresh: true, latestWins: true, reset: true, stored: 5, version: 5, want: applied},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.fresh, !tt.latestWins, tt.baseline, tt.reset, tt.prev, tt.stored, tt.version)
			require.Equal(t, tt.want, got.outcome, "outcome %s", got.outcome)
			require.Equal(t, tt.afterReset, got.afterReset)
		})
	}
}

// A gap that waited GapTimeout becomes the baseline only with
// BaselineBefore and never on an aggregate waiting for its history after a
// reset: there it is dead, to heal when the replay brings its predecessor.
func TestEndGap(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		baselineBefore, afterReset bool
		want                       gapEnding
	}{
		{false, false, gapDead},
		{true, false, gapBaseline},
		{false, true, gapDead},
		{true, true, gapDead},
	} {
		t.Run(fmt.Sprintf("baseline=%t reset=%t", tt.baselineBefore, tt.afterReset), func(t *testing.T) {
			require.Equal(t, tt.want, endGap(tt.baselineBefore, tt.afterReset))
		})
	}
}

// A gap's text stays true whatever happened to the version before: it
// had not been applied, which does not say it had not arrived (it may be
// dead in dead_letters).
func TestHoldReason(t *testing.T) {
	for _, tc := range []struct {
		o            outcome
		reason, text string
	}{
		{gap, "gap", "version 3 arrived before version 2 was applied"},
		{held, "behind an earlier event of its aggregate", ""},
	} {
		reason, text := holdReason(tc.o, events.Envelope{AggregateVersion: 3})
		require.Equal(t, tc.reason, reason, tc.o)
		require.Equal(t, tc.text, text, tc.o)
	}
}
