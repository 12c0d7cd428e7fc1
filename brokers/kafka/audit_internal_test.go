package kafka

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	// Two partitions; samples at t=1000 (watermarks 10, 5), 2000 (20, 5),
	// 3000 (30, 8); the floors: partition 0 consumed up to 20 (its time,
	// 2000), partition 1 up to 5 (2000).
	prev := &auditState{V: auditVersion, Exists: true, ID: "A",
		Parts:   []partState{{High: 30, Start: 0, Floor: 2000}, {High: 8, Start: 2, Floor: 2000}},
		Samples: []sample{{At: 1000, High: []int64{10, 5}}, {At: 2000, High: []int64{20, 5}}, {At: 3000, High: []int64{30, 8}}}}
	seen := func(mut func(o *observed)) observed {
		o := observed{exists: true, id: "A", high: []int64{30, 8}, start: []int64{0, 2}}
		if mut != nil {
			mut(&o)
		}
		return o
	}
	for _, tt := range []struct {
		name  string
		prev  *auditState
		o     observed
		want  string // a part of the reason; "" for no loss
		since int64  // Unix ms
	}{
		{"no state: a baseline", nil, observed{}, "", 0},
		{"topic missing at the baseline, created since", &auditState{V: auditVersion}, seen(nil), "", 0},
		{"nothing changed", prev, seen(nil), "", 0},
		{"written", prev, seen(func(o *observed) { o.high = []int64{40, 9} }), "", 0},
		{"retention or DeleteRecords: log start offsets forward", prev,
			seen(func(o *observed) { o.start = []int64{30, 8} }), "", 0},
		{"partitions added", prev, seen(func(o *observed) { o.high, o.start = []int64{30, 8, 0}, []int64{0, 2, 0} }), "", 0},
		{"topic missing", prev, observed{}, "topic missing", 2000},
		{"topic recreated, more records than before", prev,
			seen(func(o *observed) { o.id, o.high = "B", []int64{50, 50} }), "topic recreated (id B, was A)", 2000},
		{"no topic ids: fewer partitions", &auditState{V: auditVersion, Exists: true, Parts: prev.Parts, Samples: prev.Samples},
			seen(func(o *observed) { o.id, o.high, o.start = "", []int64{30}, []int64{0} }), "partitions went from 2 to 1", 2000},
		{"no topic ids: a log start offset went back", &auditState{V: auditVersion, Exists: true, Parts: prev.Parts, Samples: prev.Samples},
			seen(func(o *observed) { o.id, o.start, o.high = "", []int64{0, 0}, []int64{30, 9} }), "partition 1's log start offset went back from 2 to 0", 2000},
		// Without ids, any offset back puts back the whole topic, from the
		// lowest floor: a recreation may show on one partition only (the
		// other one's new records already past its old offsets).
		{"no topic ids: a log start offset back on one partition, the other's floor lower", &auditState{V: auditVersion, Exists: true,
			Parts: []partState{{High: 1000, Start: 0, Floor: 1000}, {High: 500, Start: 300, Floor: 9000}}},
			observed{exists: true, high: []int64{1200, 10}, start: []int64{0, 0}}, "partition 1's log start offset went back", 1000},
		{"no topic ids: a high watermark back is not refined by the samples", &auditState{V: auditVersion, Exists: true,
			Parts: []partState{{High: 1000, Floor: 1000}}, Samples: []sample{{At: 5000, High: []int64{300}}}},
			observed{exists: true, high: []int64{300}, start: []int64{0}}, "a truncation and a recreation look alike", 1000},
		{"same topic id: a log start offset seen lower (a new leader) is no loss", prev,
			seen(func(o *observed) { o.start = []int64{0, 0} }), "", 0},
		// Truncated to 25: records from 25 were acknowledged after the
		// sample of 20 (2000) at the earliest; the floor is 2000 too.
		{"high watermark back, within what the groups had not consumed", prev,
			seen(func(o *observed) { o.high = []int64{25, 8} }), "partition 0's high watermark went back from 30 to 25", 2000},
		// Truncated to 29 on a partition consumed up to 20: the records lost
		// were acknowledged after the sample at 2000.
		{"high watermark back, above every sample but the last", &auditState{V: auditVersion, Exists: true, ID: "A",
			Parts: []partState{{High: 30, Floor: 1000}, {High: 8, Start: 2, Floor: 1000}}, Samples: prev.Samples},
			seen(func(o *observed) { o.high = []int64{29, 8} }), "went back from 30 to 29", 2000},
		// The floor's time is later than the truncation's sample: what the
		// groups had consumed is not sent again.
		{"high watermark back below what the groups had consumed", &auditState{V: auditVersion, Exists: true, ID: "A",
			Parts: []partState{{High: 30, Floor: 2500}, {High: 8, Start: 2, Floor: 2500}}, Samples: prev.Samples},
			seen(func(o *observed) { o.high = []int64{15, 8} }), "went back from 30 to 15", 2500},
		{"high watermark back below every sample: the floor", &auditState{V: auditVersion, Exists: true, ID: "A",
			Parts: []partState{{High: 30, Floor: 500}, {High: 8, Start: 2, Floor: 500}}, Samples: prev.Samples[1:]},
			seen(func(o *observed) { o.high = []int64{15, 8} }), "went back from 30 to 15", 500},
		{"two partitions back: the earliest", prev,
			seen(func(o *observed) { o.high = []int64{25, 4} }), "partition 1's high watermark went back from 8 to 4", 2000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reason, since := decide(tt.prev, tt.o)
			if tt.want == "" {
				require.Empty(t, reason)
				return
			}
			require.True(t, strings.Contains(reason, tt.want), "reason %q, want %q", reason, tt.want)
			require.Equal(t, time.UnixMilli(tt.since), since)
		})
	}
}

func TestSamples(t *testing.T) {
	t.Parallel()
	var s []sample
	s = addSample(s, 1000, []int64{0, 0})
	s = addSample(s, 2000, []int64{10, 0})
	s = addSample(s, 3000, []int64{10, 0}) // nothing moved: the newest takes the later time
	require.Equal(t, []sample{{At: 1000, High: []int64{0, 0}}, {At: 3000, High: []int64{10, 0}}}, s)
	s = addSample(s, 4000, []int64{10, 5, 0}) // a partition added

	for _, tt := range []struct {
		p      int
		offset int64
		want   int64
		ok     bool
	}{
		{0, 0, 1000, true},  // the first record of partition 0 came after the first sample
		{0, 9, 1000, true},  // so did its tenth
		{0, 10, 4000, true}, // its eleventh, after the last
		{1, 0, 3000, true},
		{1, 4, 3000, true},
		{2, 0, 4000, true}, // a partition the older samples lack had no records
	} {
		got, ok := sampleTime(s, tt.p, tt.offset)
		require.Equal(t, tt.ok, ok, "partition %d offset %d", tt.p, tt.offset)
		require.Equal(t, tt.want, got, "partition %d offset %d", tt.p, tt.offset)
	}
	_, ok := sampleTime([]sample{{At: 1000, High: []int64{5}}}, 0, 4)
	require.False(t, ok, "an offset below every sample")

	for i := range 2 * maxSamples {
		s = addSample(s, int64(5000+i), []int64{int64(20 + i)})
	}
	require.Len(t, s, maxSamples)
	require.Equal(t, int64(5000+2*maxSamples-1), s[len(s)-1].At)

	// floorTime: everything consumed is now; otherwise the samples.
	at, ok := floorTime(s, 0, 200, 200, 9999)
	require.True(t, ok)
	require.Equal(t, int64(9999), at)
	_, ok = floorTime(s, 0, 0, 200, 9999)
	require.False(t, ok, "a floor older than the history")
}
