package redis

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Trim removes from stream the entries that every consumer group has
// acknowledged: those below both the group's oldest pending entry and, when
// nothing is pending, its last delivered one. A stream without consumer
// groups is left alone: nobody has read it yet. It returns how many entries
// were removed.
func (b *Broker) Trim(ctx context.Context, stream string) (int64, error) {
	floors, err := b.floors(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", stream, err)
	}
	var minID string
	for _, f := range floors {
		if minID == "" || lessID(f, minID) {
			minID = f
		}
	}
	if minID == "" {
		return 0, nil // no group: nobody has read the stream yet
	}
	n, err := b.cfg.Client.XTrimMinIDApprox(ctx, stream, minID, 0).Result()
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", stream, err)
	}
	return n, nil
}

// TrimTopic trims every stream of topic.
func (b *Broker) TrimTopic(ctx context.Context, topic string) (int64, error) {
	var total int64
	for _, s := range b.Streams(topic) {
		n, err := b.Trim(ctx, s)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func parseID(id string) (ms, seq uint64) {
	a, b, _ := strings.Cut(id, "-")
	ms, _ = strconv.ParseUint(a, 10, 64)
	seq, _ = strconv.ParseUint(b, 10, 64)
	return ms, seq
}

func lessID(a, b string) bool { return compareID(a, b) < 0 }

func compareID(a, b string) int {
	am, as := parseID(a)
	bm, bs := parseID(b)
	if c := cmp.Compare(am, bm); c != 0 {
		return c
	}
	return cmp.Compare(as, bs)
}

func nextID(id string) string {
	ms, seq := parseID(id)
	return strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(seq+1, 10)
}
