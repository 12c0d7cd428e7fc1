package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	prev := &auditState{Canary: "tok", Added: 100, Last: "1000-5", SafeSince: 900}
	seen := func(mut func(o *observed)) observed {
		o := observed{canary: "tok", stream: true, added: 100, last: "1000-5", first: "900-0",
			floors: map[string]string{"g": "950-0"}}
		if mut != nil {
			mut(&o)
		}
		return o
	}
	for _, tt := range []struct {
		name string
		prev *auditState
		o    observed
		want string // a part of the reason; "" for no loss
	}{
		{"no state: a baseline", nil, observed{}, ""},
		{"nothing changed", prev, seen(nil), ""},
		{"entries added", prev, seen(func(o *observed) { o.added, o.last = 120, "1100-0" }), ""},
		{"flushed: canary and stream gone", prev, observed{}, "canary missing"},
		{"flushed, then written again", prev, seen(func(o *observed) { o.canary, o.added, o.last = "", 3, "2000-0" }), "canary missing"},
		{"canary replaced", prev, seen(func(o *observed) { o.canary = "other" }), "canary replaced"},
		{"stream deleted", prev, seen(func(o *observed) { o.stream, o.added, o.last, o.first, o.floors = false, 0, "", "", nil }), "stream missing"},
		{"stream missing, never had an entry", &auditState{Canary: "tok"}, observed{canary: "tok"}, ""},
		{"entries-added went back", prev, seen(func(o *observed) { o.added = 90 }), "entries-added went back from 100 to 90"},
		{"last-generated-id went back", prev, seen(func(o *observed) { o.last = "999-0" }), "last-generated-id went back"},
		{"failover to a lagging replica, then more entries: last entry gone above the first",
			prev, seen(func(o *observed) { o.added, o.last, o.probe, o.probeGone = 104, "1200-0", "1000-5", true }), "above the stream's first entry"},
		{"last entry gone below the first, a group had not acknowledged it",
			prev, seen(func(o *observed) {
				o.added, o.last, o.first, o.probe, o.probeGone = 130, "1200-0", "1100-0", "1000-5", true
			}), "group g had not acknowledged"},
		{"last entry gone from a stream without groups",
			prev, seen(func(o *observed) {
				o.added, o.last, o.first, o.floors, o.probe, o.probeGone = 130, "1200-0", "1100-0", nil, "1000-5", true
			}), "without consumer groups"},
		{"trimmed: every group had acknowledged the last entry",
			prev, seen(func(o *observed) {
				o.added, o.last, o.first, o.probe, o.probeGone = 130, "1200-0", "1100-0", "1000-5", true
				o.floors = map[string]string{"g": "1000-6", "h": "1150-0"}
			}), ""},
		{"trimmed to empty, then more entries",
			prev, seen(func(o *observed) {
				o.added, o.last, o.first, o.probe, o.probeGone = 101, "1200-0", "1200-0", "1000-5", true
				o.floors = map[string]string{"g": "1000-6"}
			}), ""},
		{"failover between audits: an acknowledged entry above last-generated-id",
			prev, seen(func(o *observed) { o.added, o.last, o.probe = 103, "1100-0", "1150-0" }), "acknowledged to the forwarder"},
		{"failover between audits, then more entries: an acknowledged entry gone",
			prev, seen(func(o *observed) { o.added, o.last, o.probe, o.probeGone = 110, "1300-0", "1150-0", true }), "entry 1150-0 missing"},
		{"an acknowledged entry present", prev, seen(func(o *observed) { o.added, o.last, o.probe = 110, "1300-0", "1150-0" }), ""},
		{"one group of two behind the trimmed entry",
			prev, seen(func(o *observed) {
				o.added, o.last, o.first, o.probe, o.probeGone = 130, "1200-0", "1100-0", "1000-5", true
				o.floors = map[string]string{"g": "1150-0", "h": "1000-5"}
			}), "group h had not acknowledged"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.prev, tt.o)
			if tt.want == "" {
				require.Empty(t, got)
				return
			}
			require.Contains(t, got, tt.want)
		})
	}
}

func TestProbeIDs(t *testing.T) {
	t.Parallel()
	prev := &auditState{Last: "1000-5"}
	for _, tt := range []struct {
		name        string
		prev        *auditState
		acked, last string
		want        []string
	}{
		{"nothing moved", prev, "", "1000-5", nil},
		{"last-generated-id moved", prev, "", "1200-0", []string{"1000-5"}},
		{"acknowledged since", prev, "1100-0", "1100-0", []string{"1000-5", "1100-0"}},
		{"acknowledged since, last-generated-id back where it was", prev, "1100-0", "1000-5", []string{"1100-0"}},
		{"acknowledged, older than prev.Last", prev, "900-0", "1200-0", []string{"1000-5"}},
		{"empty stream before", &auditState{Last: "0-0"}, "", "1200-0", nil},
		{"no stream before, acknowledged since", &auditState{}, "1100-0", "1100-0", []string{"1100-0"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, probeIDs(tt.prev, tt.acked, tt.last))
		})
	}
}

func TestSafeSince(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(5000)
	for _, tt := range []struct {
		name string
		o    observed
		want int64
	}{
		{"no stream", observed{now: now}, 5000},
		{"empty stream", observed{now: now, stream: true, last: "1000-0"}, 5000},
		{"no group: the first entry", observed{now: now, stream: true, first: "800-0", last: "1000-0"}, 800},
		{"the lowest group floor", observed{now: now, stream: true, first: "800-0", last: "1000-0",
			floors: map[string]string{"g": "950-0", "h": "900-3"}}, 900},
		{"a floor below the first entry: the first entry", observed{now: now, stream: true, first: "800-0", last: "1000-0",
			floors: map[string]string{"g": "0-1"}}, 800},
		{"everything acknowledged: now", observed{now: now, stream: true, first: "800-0", last: "1000-0",
			floors: map[string]string{"g": "1000-1"}}, 5000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, safeSince(tt.o))
		})
	}
}

// hashTag is Redis Cluster's rule: the part between the first "{" and the
// next "}", if not empty; else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

func TestCanaryKeySharesTheStreamsSlot(t *testing.T) {
	t.Parallel()
	for _, stream := range []string{"payments", "app:payments.3", "{payments}.3", "x{y}z.0"} {
		k := CanaryKey(stream)
		require.Equal(t, hashTag(stream), hashTag(k), "canary %q of stream %q", k, stream)
		require.True(t, strings.HasPrefix(k, stream), "the canary starts with the stream's name")
	}
}
