package nats

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	prev := &auditState{Created: created, Last: 100}
	tests := []struct {
		name string
		prev *auditState
		o    observed
		want string // a part of the reason; "" for no loss
	}{
		{"baseline", nil, observed{}, ""},
		{"baseline of a stream", nil, observed{stream: true, created: created, last: 5}, ""},
		{"unchanged", prev, observed{stream: true, created: created, last: 100}, ""},
		{"grew", prev, observed{stream: true, created: created, last: 250}, ""},
		{"same time in another zone", prev, observed{stream: true, created: created.In(time.FixedZone("x", 3600)), last: 100}, ""},
		{"missing", prev, observed{}, "stream missing"},
		{"recreated and grown past", prev, observed{stream: true, created: created.Add(time.Second), last: 500}, "stream recreated"},
		{"recreated empty", prev, observed{stream: true, created: created.Add(time.Second)}, "stream recreated"},
		{"last went back", prev, observed{stream: true, created: created, last: 99}, "last sequence went back from 100 to 99"},
		{"no stream then, none now", &auditState{}, observed{}, ""},
		{"no stream then, one now", &auditState{}, observed{stream: true, created: created, last: 3}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.prev, tt.o)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("decide = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSafeSince(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	next, last := now.Add(-time.Hour), now.Add(-time.Minute)
	tests := []struct {
		name     string
		in       floorInput
		next     time.Time // the subject's message at or after safeFrom
		wantFrom uint64
		want     time.Time
	}{
		{"no consumer: the first message", floorInput{firstSeq: 40, lastTime: last}, next, 40, next},
		{"no consumer, empty stream never written", floorInput{}, time.Time{}, 1, now},
		{"consumer behind", floorInput{consumers: true, floor: 57, firstSeq: 40, lastTime: last}, next, 57, next},
		{"consumer floor below the first message (purged)", floorInput{consumers: true, floor: 3, firstSeq: 40, lastTime: last}, next, 40, next},
		{"everything acknowledged: the last message's time", floorInput{consumers: true, floor: 101, firstSeq: 40, lastTime: last}, time.Time{}, 101, last},
		{"a new consumer", floorInput{consumers: true, floor: 1, firstSeq: 1, lastTime: last}, next, 1, next},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := safeFrom(tt.in); got != tt.wantFrom {
				t.Fatalf("safeFrom = %d, want %d", got, tt.wantFrom)
			}
			if got := safeSince(tt.next, tt.in, now); !got.Equal(tt.want) {
				t.Fatalf("safeSince = %s, want %s", got, tt.want)
			}
		})
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
