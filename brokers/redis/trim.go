package redis

import (
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
	groups, err := b.cfg.Client.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if isNoSuchKey(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("trim %s: %w", stream, err)
	}
	if len(groups) == 0 {
		return 0, nil
	}
	var minID string
	for _, g := range groups {
		keep := nextID(g.LastDeliveredID) // everything up to last-delivered was delivered...
		if g.Pending > 0 {                // ...but what is pending is not yet acknowledged
			p, err := b.cfg.Client.XPending(ctx, stream, g.Name).Result()
			if err != nil {
				return 0, fmt.Errorf("trim %s: %w", stream, err)
			}
			keep = p.Lower
		}
		if minID == "" || lessID(keep, minID) {
			minID = keep
		}
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

func lessID(a, b string) bool {
	am, as := parseID(a)
	bm, bs := parseID(b)
	return am < bm || (am == bm && as < bs)
}

func nextID(id string) string {
	ms, seq := parseID(id)
	return strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(seq+1, 10)
}
