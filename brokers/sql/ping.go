package sql

import (
	"context"
	"fmt"

	"github.com/outflow-dev/outflow/brokers"
)

var _ brokers.Pinger = (*sqlBackend)(nil)

// Ping pings the database of the broker's tables.
func (b *sqlBackend) Ping(ctx context.Context) error {
	if err := b.pool.Ping(ctx); err != nil {
		return fmt.Errorf("sql broker ping: %w", err)
	}
	return nil
}
