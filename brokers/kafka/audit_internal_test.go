package kafka

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/forwarder"
)

func TestJudge(t *testing.T) {
	t.Parallel()
	const (
		U = forwarder.Unsettled
		S = forwarder.Settled
		L = forwarder.Lost
	)
	// One partition: the log holds offsets [10, 20); the records at 10 to
	// 14 were fetched (m10 to m14), the fetch covered [10, 15).
	part := func(mut func(*partLook)) partLook {
		pl := partLook{start: 10, high: 20, covered: []span{{10, 15}},
			records: map[int64]string{10: "m10", 11: "m11", 12: "m12", 13: "m13", 14: "m14"}}
		if mut != nil {
			mut(&pl)
		}
		return pl
	}
	look := func(groups ...groupLook) topicLook {
		return topicLook{exists: true, id: "A", parts: []partLook{part(nil)}, before: groups}
	}
	g := func(name string, next int64) groupLook { return groupLook{name: name, next: []int64{next}} }
	h := func(pos, id string) forwarder.Held { return forwarder.Held{Position: pos, MessageID: id} }
	for _, tt := range []struct {
		name   string
		prevID string
		l      topicLook
		held   []forwarder.Held
		want   []forwarder.Status
		reason string // a part of the reason; "" when nothing is lost
	}{
		{"found, no group yet", "A", look(), []forwarder.Held{h("0:12", "m12")}, []forwarder.Status{U}, ""},
		{"found, every group past it", "A", look(g("g", 13), g("h", 20)), []forwarder.Held{h("0:12", "m12")}, []forwarder.Status{S}, ""},
		{"found, a group at it", "A", look(g("g", 13), g("h", 12)), []forwarder.Held{h("0:12", "m12")}, []forwarder.Status{U}, ""},
		{"found, a group with no offset reads from the log start", "A", look(g("g", 13), g("new", -1)),
			[]forwarder.Held{h("0:12", "m12")}, []forwarder.Status{U}, ""},
		{"found without a message id to compare (the row purged)", "A", look(g("g", 20)), []forwarder.Held{h("0:12", "")}, []forwarder.Status{S}, ""},
		{"another message at the offset", "A", look(g("g", 20)), []forwarder.Held{h("0:12", "other")}, []forwarder.Status{L}, "holds another message"},
		{"at the high watermark: truncated, a group's offset past it no proof", "A", look(g("g", 25)),
			[]forwarder.Held{h("0:20", "m20"), h("0:24", "m24")}, []forwarder.Status{L, L}, "at or above partition 0's high watermark 20"},
		{"below the log start, every group past it", "A", look(g("g", 12), g("h", 15)), []forwarder.Held{h("0:5", "m5")}, []forwarder.Status{S}, ""},
		{"below the log start, a group short of it", "A", look(g("g", 12), g("h", 3)), []forwarder.Held{h("0:5", "m5")}, []forwarder.Status{L},
			"below partition 0's log start offset 10 (retention, DeleteRecords) before group h consumed it"},
		{"below the log start, a group with no offset (created after the trim)", "A", look(g("g", 12), g("new", -1)),
			[]forwarder.Held{h("0:5", "m5")}, []forwarder.Status{S}, ""},
		{"below the log start, no group at all", "A", look(), []forwarder.Held{h("0:5", "m5")}, []forwarder.Status{S}, ""},
		{"below the log start of a topic recreated since the last Check", "OLD", look(g("g", 12)), []forwarder.Held{h("0:5", "m5")},
			[]forwarder.Status{L}, "recreated since the last audit (id A, was OLD)"},
		{"no previous state: trusted", "", look(g("g", 12)), []forwarder.Held{h("0:5", "m5")}, []forwarder.Status{S}, ""},
		{"missing inside the log (compaction), every group past it", "A",
			topicLook{exists: true, id: "A", parts: []partLook{part(func(p *partLook) { delete(p.records, 12) })}, before: []groupLook{g("g", 14)}},
			[]forwarder.Held{h("0:12", "m12")}, []forwarder.Status{S}, ""},
		{"missing inside the log, a group short of it", "A",
			topicLook{exists: true, id: "A", parts: []partLook{part(func(p *partLook) { delete(p.records, 12) })}, before: []groupLook{g("g", 11)}},
			[]forwarder.Held{h("0:12", "m12")}, []forwarder.Status{L}, "missing from partition 0's log"},
		{"missing records judged with the offsets read after", "A",
			topicLook{exists: true, id: "A", parts: []partLook{part(nil)}, before: []groupLook{g("g", 3)}, after: []groupLook{g("g", 12)}},
			[]forwarder.Held{h("0:5", "m5"), h("0:11", "m11")}, []forwarder.Status{S, U}, ""},
		{"not fetched (beyond the budget): unsettled", "A", look(g("g", 20)), []forwarder.Held{h("0:17", "m17")}, []forwarder.Status{U}, ""},
		{"no record format with headers: found", "A",
			topicLook{exists: true, id: "A", parts: []partLook{{start: 10, high: 20, unread: true}}, before: []groupLook{g("g", 20)}},
			[]forwarder.Held{h("0:17", "m17")}, []forwarder.Status{S}, ""},
		{"topic missing", "A", topicLook{}, []forwarder.Held{h("0:12", "m12")}, []forwarder.Status{L}, "topic missing"},
		{"partition missing", "A", look(g("g", 20)), []forwarder.Held{h("3:1", "m")}, []forwarder.Status{L}, "partition 3 missing"},
		{"position unreadable", "A", look(g("g", 20)), []forwarder.Held{h("12", "m12")}, []forwarder.Status{L}, `position "12" unreadable`},
		{"the first loss gives the reason", "A", look(g("g", 20)), []forwarder.Held{h("0:12", "m12"), h("0:13", "x"), h("0:22", "m22")},
			[]forwarder.Status{S, L, L}, "record 0:13 holds another message"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			places := make([]place, len(tt.held))
			for i, h := range tt.held {
				places[i] = parsePosition(h.Position)
			}
			status, reason := judge(tt.prevID, tt.l, places, tt.held)
			require.Equal(t, tt.want, status, reason)
			if tt.reason == "" {
				require.Empty(t, reason)
				return
			}
			require.True(t, strings.Contains(reason, tt.reason), "reason %q, want %q", reason, tt.reason)
		})
	}
}

// A group's committed offset counts only when it is an offset of the log
// as it is: the topic's (by the subscriber's stamp), within the log, and,
// when the record before it was fetched, after the message the group
// consumed last.
func TestTrustCommit(t *testing.T) {
	t.Parallel()
	part := partLook{start: 10, high: 20, records: map[int64]string{14: "m14"}}
	for _, tt := range []struct {
		name string
		c    commit
		want bool
	}{
		{"no offset", commit{offset: -1}, false},
		{"no stamp", commit{offset: 15}, true},
		{"stamped with the topic's id", commit{offset: 15, meta: "A"}, true},
		{"stamped with another topic's id", commit{offset: 15, meta: "B m14"}, false},
		{"past the high watermark: the log was cut", commit{offset: 21, meta: "A m20"}, false},
		{"at the high watermark: consumed everything", commit{offset: 20, meta: "A m19"}, true},
		{"the record before it is the one the group consumed", commit{offset: 15, meta: "A m14"}, true},
		{"the record before it is another message: the log was cut and written again", commit{offset: 15, meta: "A m-old"}, false},
		{"the record before it was not fetched: nothing to compare", commit{offset: 17, meta: "A m16"}, true},
		{"a broker without topic ids", commit{offset: 15, meta: " m-old"}, false},
		{"at the log start: the record before it is gone", commit{offset: 10, meta: "A m9"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, trustCommit(tt.c, "A", part))
		})
	}
}

func TestPositionAndStamp(t *testing.T) {
	t.Parallel()
	require.Equal(t, "3:1042", position(3, 1042))
	require.Equal(t, place{p: 3, o: 1042, ok: true}, parsePosition("3:1042"))
	for _, bad := range []string{"", "3", "3:", ":4", "a:1", "1:b", "-1:4", "1:-4", "1:2:3", "99999999999:1"} {
		require.False(t, parsePosition(bad).ok, bad)
	}
	for _, s := range []stamp{{"A", "m"}, {"A", ""}, {"", "m"}, {"", ""}} {
		require.Equal(t, s, parseStamp(s.String()))
	}
	require.Equal(t, stamp{topicID: "A"}, parseStamp("A"), "a stamp from before message ids")
}
