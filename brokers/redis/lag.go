package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/brokers"
)

var _ brokers.LagReporter = (*backend)(nil)

// lagCountMax bounds the entries counted one by one when Redis cannot tell
// a group's lag (entries deleted from the middle of a stream).
const lagCountMax = 10000

// Lag sums, over topic's streams, what group has not handled: the entries
// not delivered to it yet (XINFO GROUPS' lag) and those delivered but not
// acknowledged (pending). The oldest age is that of the oldest of them, by
// its entry id's time. A stream that does not exist yet lags by nothing; a
// group not created yet lags by the whole stream, where it
// will start.
func (b *backend) Lag(ctx context.Context, group, topic string) (brokers.Lag, error) {
	var (
		lag    brokers.Lag
		oldest time.Time
	)
	older := func(id string) {
		if t, ok := idTime(id); ok && (oldest.IsZero() || t.Before(oldest)) {
			oldest = t
		}
	}
	for _, stream := range b.broker.Streams(topic) {
		groups, err := b.client.XInfoGroups(ctx, stream).Result()
		if err != nil {
			if isNoSuchKey(err) {
				continue
			}
			return brokers.Lag{}, fmt.Errorf("redis lag of %s on %s: %w", group, stream, err)
		}
		if !slices.ContainsFunc(groups, func(g goredis.XInfoGroup) bool { return g.Name == group }) {
			// Not created yet: the group will start at the stream's
			// beginning (Config.OldestID "0"), so all of it lags.
			n, err := b.client.XLen(ctx, stream).Result()
			if err != nil {
				return brokers.Lag{}, fmt.Errorf("redis lag of %s on %s: %w", group, stream, err)
			}
			first, err := b.client.XRangeN(ctx, stream, "-", "+", 1).Result()
			if err != nil {
				return brokers.Lag{}, fmt.Errorf("redis lag of %s on %s: %w", group, stream, err)
			}
			if len(first) > 0 {
				older(first[0].ID)
			}
			lag.Events += n
			continue
		}
		for _, g := range groups {
			if g.Name != group {
				continue
			}
			next, err := b.client.XRangeN(ctx, stream, "("+g.LastDeliveredID, "+", 1).Result()
			if err != nil {
				return brokers.Lag{}, fmt.Errorf("redis lag of %s on %s: %w", group, stream, err)
			}
			n := g.Lag
			if n < 0 { // Redis cannot tell: count, up to a bound
				rest, err := b.client.XRangeN(ctx, stream, "("+g.LastDeliveredID, "+", lagCountMax).Result()
				if err != nil {
					return brokers.Lag{}, fmt.Errorf("redis lag of %s on %s: %w", group, stream, err)
				}
				n = int64(len(rest))
			}
			if len(next) > 0 && n > 0 {
				older(next[0].ID)
			}
			lag.Events += n + g.Pending
			if g.Pending > 0 {
				p, err := b.client.XPending(ctx, stream, group).Result()
				if err != nil && !errors.Is(err, goredis.Nil) {
					return brokers.Lag{}, fmt.Errorf("redis lag of %s on %s: %w", group, stream, err)
				}
				if p != nil {
					older(p.Lower)
				}
			}
		}
	}
	if lag.Events > 0 && !oldest.IsZero() {
		lag.OldestAge = max(time.Since(oldest), 0)
	}
	return lag, nil
}

// idTime is the time part of a stream entry id ("<ms>-<seq>").
func idTime(id string) (time.Time, bool) {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}
