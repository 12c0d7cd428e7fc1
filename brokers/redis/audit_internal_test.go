package redis

import (
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/forwarder"
)

func TestJudge(t *testing.T) {
	const (
		U = forwarder.Unsettled
		S = forwarder.Settled
		L = forwarder.Lost
	)
	prev := &auditState{Canary: "tok", Trimmed: "9-5"} // the audit trimmed below 9-5
	// A stream 10-0 .. 20-0, whose group has acknowledged below 15-0.
	base := look{canary: "tok", stream: true, first: "10-0", last: "20-0", maxDeleted: "0-0",
		floors0: map[string]string{"g": "15-0"}, floors: map[string]string{"g": "15-0"}}
	with := func(f func(*look)) look {
		l := base
		l.floors0 = map[string]string{"g": "15-0"}
		l.floors = map[string]string{"g": "15-0"}
		f(&l)
		return l
	}
	tests := []struct {
		name   string
		prev   *auditState
		look   look
		pos    string
		found  bool
		want   forwarder.Status
		reason string // a part of the reason, when Lost
	}{
		{"found, acknowledged", prev, base, "12-0", true, S, ""},
		{"found, not acknowledged", prev, base, "16-0", true, U, ""},
		{"found, no group reads it yet", prev, with(func(l *look) { l.floors0 = map[string]string{} }), "12-0", true, U, ""},
		{"found, acknowledged only after the look began", prev, with(func(l *look) { l.floors0["g"] = "11-0" }), "12-0", true, U, ""},
		{"missing above the last-generated-id", prev, base, "21-0", false, L, "last-generated-id"},
		{"missing between first and last, no deletion", prev, base, "12-0", false, L, "failover"},
		{"missing between first and last, group moved past it (a failover)", prev, with(func(l *look) { l.floors["g"] = "20-1" }), "16-0", false, L, "failover"},
		{"deleted after every group had it", prev, with(func(l *look) { l.maxDeleted = "13-0" }), "12-0", false, S, ""},
		{"deleted before the group had it", prev, with(func(l *look) { l.maxDeleted = "17-0" }), "16-0", false, L, "deleted before group g"},
		{"trimmed by the audit", prev, base, "9-0", false, S, ""},
		{"trimmed by the audit, stream empty now", prev, with(func(l *look) { l.first = "" }), "9-0", false, S, ""},
		{"below the first entry, above the audit's trim: a failover then new entries, or another's trim", prev, base, "9-9", false, L, "above what the audit trimmed"},
		{"below the first entry, a group had not acknowledged it", prev, with(func(l *look) { l.floors["g"] = "8-0" }), "9-0", false, L, "group g had not acknowledged"},
		{"below the first entry of a stream without groups", prev, with(func(l *look) { l.floors = map[string]string{} }), "9-0", false, L, "(no group)"},
		{"stream missing", prev, with(func(l *look) { l.stream = false }), "12-0", false, L, "stream missing"},
		{"canary missing (flush)", prev, with(func(l *look) { l.canary = "" }), "9-0", false, L, "flushed"},
		{"canary missing, entry between first and last", prev, with(func(l *look) { l.canary = "" }), "12-0", false, L, "flushed"},
		{"no audit ever ran and no canary (a flush before the first audit)", nil, with(func(l *look) { l.canary = "" }), "9-0", false, L, "flushed"},
		{"no saved state: nothing the audit trimmed", nil, base, "9-0", false, L, "above what the audit trimmed"},
		{"no saved state, entry found", nil, base, "12-0", true, S, ""},
		{"canary replaced", prev, with(func(l *look) { l.canary = "other" }), "9-0", false, L, "replaced"},
		{"canary missing, entry found: nothing lost", prev, with(func(l *look) { l.canary = "" }), "12-0", true, S, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.look
			l.found, l.other = []bool{tt.found}, []bool{false}
			status, reason := judge(tt.prev, l, []forwarder.Held{{Position: tt.pos}})
			if status[0] != tt.want {
				t.Fatalf("status %d, want %d (reason %q)", status[0], tt.want, reason)
			}
			if tt.want == L && !strings.Contains(reason, tt.reason) {
				t.Fatalf("reason %q does not say %q", reason, tt.reason)
			}
			if tt.want != L && reason != "" {
				t.Fatalf("a reason, %q, without a loss", reason)
			}
		})
	}
	t.Run("another message at the id", func(t *testing.T) {
		l := base
		l.found, l.other = []bool{false}, []bool{true}
		status, reason := judge(prev, l, []forwarder.Held{{Position: "12-0"}})
		if status[0] != L || !strings.Contains(reason, "another message") {
			t.Fatalf("status %d, reason %q", status[0], reason)
		}
	})
}

func TestTrimBound(t *testing.T) {
	const (
		U = forwarder.Unsettled
		S = forwarder.Settled
		L = forwarder.Lost
	)
	held := func(ps ...string) []forwarder.Held {
		out := make([]forwarder.Held, len(ps))
		for i, p := range ps {
			out[i] = forwarder.Held{Position: p}
		}
		return out
	}
	l := look{stream: true, floors0: map[string]string{"a": "30-0", "b": "25-0"}}
	tests := []struct {
		name   string
		look   look
		held   []forwarder.Held
		status []forwarder.Status
		want   string
	}{
		{"settled prefix", l, held("10-0", "11-0", "12-0"), []forwarder.Status{S, S, U}, "11-1"},
		{"unordered, settled prefix by id", l, held("12-0", "10-0", "11-0"), []forwarder.Status{U, S, S}, "11-1"},
		{"a lost entry stops the prefix", l, held("10-0", "11-0", "12-0"), []forwarder.Status{S, L, S}, "10-1"},
		{"nothing settled first", l, held("10-0", "11-0"), []forwarder.Status{U, S}, ""},
		{"capped by the lowest floor", l, held("10-0", "26-0"), []forwarder.Status{S, S}, "25-0"},
		{"no group", look{stream: true, floors0: map[string]string{}}, held("10-0"), []forwarder.Status{S}, ""},
		{"no stream", look{floors0: map[string]string{"a": "30-0"}}, held("10-0"), []forwarder.Status{S}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := trimBound(tt.look, tt.held, tt.status); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}
