package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/brokers"
)

var _ brokers.Pinger = (*backend)(nil)

// Ping sends a PING on the backend's client; on a Cluster, to every
// primary, since each holds some of the streams: a primary that is down
// until its replica takes over is a broker that cannot take all writes.
func (b *backend) Ping(ctx context.Context) error {
	if cc, ok := b.client.(*goredis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("primary %s: %w", c.Options().Addr, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("redis cluster ping: %w", err)
		}
		return nil
	}
	if err := b.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}
