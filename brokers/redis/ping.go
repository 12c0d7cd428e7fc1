package redis

import (
	"context"
	"fmt"

	"github.com/outflow-dev/outflow/brokers"
)

var _ brokers.Pinger = (*backend)(nil)

// Ping sends a PING on the backend's client.
func (b *backend) Ping(ctx context.Context) error {
	if err := b.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}
