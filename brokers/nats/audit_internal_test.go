package nats

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/forwarder"
)

func TestJudge(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	gCreated := created.Add(time.Minute)
	// The last audit saw the stream and consumer g, which had made 10
	// deliveries up to stream sequence 10.
	st := &auditState{Created: created, Consumers: map[string]consumerMark{"g": {Created: gCreated, Delivered: 10, Stream: 10}}}
	g := func(floor, delivered uint64) map[string]reader {
		return map[string]reader{"g": {consumerMark{Created: gCreated, Delivered: delivered, Stream: max(floor, 10)}, floor}}
	}
	const (
		found   = 'f' // at its sequence, with its id
		other   = 'o' // its sequence holds another message
		missing = '-'
	)
	type tc struct {
		name   string
		st     *auditState
		seqs   []uint64
		looks  string // one of found, other, missing per seq
		before map[string]reader
		after  map[string]reader // nil: as before
		stream bool
		creat  time.Time
		last   uint64
		want   []forwarder.Status
		reason string // a part of the reason; "" for no loss
	}
	U, S, L := forwarder.Unsettled, forwarder.Settled, forwarder.Lost
	tests := []tc{
		{name: "found and acknowledged", st: st, seqs: []uint64{11, 12}, looks: "ff", before: g(12, 12),
			stream: true, creat: created, last: 12, want: []forwarder.Status{S, S}},
		{name: "found, acknowledged in part", st: st, seqs: []uint64{11, 12}, looks: "ff", before: g(11, 12),
			stream: true, creat: created, last: 12, want: []forwarder.Status{S, U}},
		{name: "found, no consumer yet", st: nil, seqs: []uint64{1}, looks: "f", before: map[string]reader{},
			stream: true, creat: created, last: 1, want: []forwarder.Status{U}},
		{name: "found, one of two consumers behind", st: st, seqs: []uint64{11}, looks: "f",
			before: map[string]reader{"g": {consumerMark{gCreated, 11, 11}, 11}, "h": {consumerMark{gCreated, 3, 3}, 3}},
			stream: true, creat: created, last: 11, want: []forwarder.Status{U}},
		{name: "found: acknowledged only after the look counts next time", st: st, seqs: []uint64{11}, looks: "f",
			before: g(10, 11), after: g(11, 11), stream: true, creat: created, last: 11, want: []forwarder.Status{U}},
		{name: "found with no earlier audit", st: nil, seqs: []uint64{5}, looks: "f", before: g(5, 5),
			stream: true, creat: created, last: 5, want: []forwarder.Status{S}},
		{name: "sequence reused by another message", st: st, seqs: []uint64{11, 12}, looks: "fo", before: g(12, 12),
			stream: true, creat: created, last: 12, want: []forwarder.Status{S, L}, reason: "sequence 12 holds another message"},
		{name: "unreadable position", st: st, seqs: []uint64{0}, looks: "-", before: g(12, 12),
			stream: true, creat: created, last: 12, want: []forwarder.Status{L}, reason: "no stream sequence"},
		{name: "stream missing", st: st, seqs: []uint64{11}, looks: "-", before: map[string]reader{},
			want: []forwarder.Status{L}, reason: "stream missing"},
		{name: "stream recreated, its consumers past the sequence", st: st, seqs: []uint64{3}, looks: "-", before: g(20, 20),
			stream: true, creat: created.Add(time.Hour), last: 20, want: []forwarder.Status{L}, reason: "created again"},
		{name: "stream created since an audit that found it missing", st: &auditState{}, seqs: []uint64{3}, looks: "-", before: g(20, 20),
			stream: true, creat: created, last: 20, want: []forwarder.Status{L}, reason: "created again"},
		{name: "above the last sequence", st: st, seqs: []uint64{11, 13}, looks: "f-", before: g(11, 13),
			stream: true, creat: created, last: 12, want: []forwarder.Status{S, L}, reason: "above the stream's last sequence 12"},
		{name: "missing with no earlier audit", st: nil, seqs: []uint64{3}, looks: "-", before: g(20, 20),
			stream: true, creat: created, last: 20, want: []forwarder.Status{L}, reason: "no earlier audit"},
		{name: "removed after it was read and acknowledged", st: st, seqs: []uint64{11, 12, 13}, looks: "--f", before: g(13, 13),
			stream: true, creat: created, last: 13, want: []forwarder.Status{S, S, S}},
		{name: "removed, read before the last audit", st: st, seqs: []uint64{9, 10}, looks: "--", before: g(10, 10),
			stream: true, creat: created, last: 10, want: []forwarder.Status{S, S}},
		{name: "purged unread: the floor moved, the deliveries did not", st: st, seqs: []uint64{11, 12}, looks: "--",
			before: g(12, 10), stream: true, creat: created, last: 12, want: []forwarder.Status{L, L}, reason: "made 0 deliveries"},
		{name: "removed, read in part", st: st, seqs: []uint64{11, 12, 13}, looks: "---",
			before: g(13, 11), stream: true, creat: created, last: 13, want: []forwarder.Status{S, L, L}, reason: "sequence 12 removed, and consumer g made 1 deliveries"},
		{name: "expired unread, the consumer reading on past it", st: st, seqs: []uint64{11, 12, 13, 14}, looks: "---f",
			before: g(14, 11), stream: true, creat: created, last: 14, want: []forwarder.Status{L, L, L, S}, reason: "sequence 11 removed, and consumer g made 1 deliveries since the last audit where reading it took at least 2"},
		{name: "deliveries counted after the removal", st: st, seqs: []uint64{11, 12}, looks: "--",
			before: g(10, 10), after: g(12, 12), stream: true, creat: created, last: 12, want: []forwarder.Status{S, S}},
		{name: "removed before the consumer acknowledged it", st: st, seqs: []uint64{11, 12}, looks: "--", before: g(11, 12),
			stream: true, creat: created, last: 12, want: []forwarder.Status{S, L}, reason: "sequence 12 removed before consumer g acknowledged it"},
		{name: "removed while no consumer reads the subject", st: st, seqs: []uint64{11}, looks: "-", before: map[string]reader{},
			stream: true, creat: created, last: 11, want: []forwarder.Status{L}, reason: "no consumer reads"},
		{name: "removed, the consumer created again", st: st, seqs: []uint64{11}, looks: "-",
			before: map[string]reader{"g": {consumerMark{gCreated.Add(time.Second), 20, 20}, 20}},
			stream: true, creat: created, last: 20, want: []forwarder.Status{L}, reason: "created again (or went back)"},
		{name: "removed, the consumer's deliveries went back", st: st, seqs: []uint64{11}, looks: "-", before: g(11, 9),
			stream: true, creat: created, last: 11, want: []forwarder.Status{L}, reason: "created again (or went back)"},
		{name: "removed, only a consumer created since the last audit", st: st, seqs: []uint64{11}, looks: "-",
			before: map[string]reader{"new": {consumerMark{gCreated, 0, 11}, 11}},
			stream: true, creat: created, last: 11, want: []forwarder.Status{L}, reason: "no consumer the last audit saw"},
		{name: "removed, and a new group joined after", st: st, seqs: []uint64{11, 12}, looks: "--",
			before: map[string]reader{"g": {consumerMark{gCreated, 12, 12}, 12}, "new": {consumerMark{gCreated, 0, 12}, 12}},
			stream: true, creat: created, last: 12, want: []forwarder.Status{S, S}},
		{name: "removed, a new group behind it", st: st, seqs: []uint64{11}, looks: "-",
			before: map[string]reader{"g": {consumerMark{gCreated, 12, 12}, 12}, "new": {consumerMark{gCreated, 0, 5}, 5}},
			stream: true, creat: created, last: 12, want: []forwarder.Status{L}, reason: "before consumer new acknowledged it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := look{seqs: tt.seqs, found: make([]bool, len(tt.seqs)), other: make([]bool, len(tt.seqs)),
				before: tt.before, after: tt.after, stream: tt.stream, created: tt.creat, last: tt.last}
			if l.after == nil {
				l.after = l.before
			}
			for i, c := range tt.looks {
				l.found[i], l.other[i] = c == found, c == other
			}
			got, reason := judge(tt.st, l, nil)
			for i := range tt.want {
				if got[i] != tt.want[i] {
					t.Fatalf("statuses %v, want %v (reason %q)", got, tt.want, reason)
				}
			}
			if (tt.reason == "") != (reason == "") || !strings.Contains(reason, tt.reason) {
				t.Fatalf("reason %q, want %q", reason, tt.reason)
			}
		})
	}
}

func TestBetween(t *testing.T) {
	t.Parallel()
	held := []uint64{3, 5, 6, 9}
	for _, tt := range []struct{ lo, hi, want uint64 }{
		{0, 10, 4}, {3, 9, 3}, {2, 3, 1}, {5, 5, 0}, {6, 5, 0}, {9, 100, 0}, {4, 8, 2},
	} {
		if got := between(held, tt.lo, tt.hi); got != tt.want {
			t.Errorf("between(%v, %d, %d) = %d, want %d", held, tt.lo, tt.hi, got, tt.want)
		}
	}
}

func TestReadsSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg     nats.ConsumerConfig
		subject string
		want    bool
	}{
		{nats.ConsumerConfig{}, "p_orders.1", true},
		{nats.ConsumerConfig{FilterSubject: "p_orders.1"}, "p_orders.1", true},
		{nats.ConsumerConfig{FilterSubject: "p_orders.0"}, "p_orders.1", false},
		{nats.ConsumerConfig{FilterSubject: "p_orders"}, "p_orders.1", false},
		{nats.ConsumerConfig{FilterSubject: "p_orders.*"}, "p_orders.1", true},
		{nats.ConsumerConfig{FilterSubject: "p_orders.*"}, "p_orders", false},
		{nats.ConsumerConfig{FilterSubject: ">"}, "p_orders.1", true},
		{nats.ConsumerConfig{FilterSubject: "p_orders.>"}, "p_orders", false},
		{nats.ConsumerConfig{FilterSubjects: []string{"a", "p_orders.1"}}, "p_orders.1", true},
		{nats.ConsumerConfig{FilterSubjects: []string{"a", "b"}}, "p_orders.1", false},
	}
	for _, tt := range tests {
		if got := readsSubject(tt.cfg, tt.subject); got != tt.want {
			t.Errorf("readsSubject(%q %v, %q) = %v", tt.cfg.FilterSubject, tt.cfg.FilterSubjects, tt.subject, got)
		}
	}
}
