package brokers

import (
	"context"
	"errors"
)

// SQLConfig is the sql block.
type SQLConfig struct {
	DatabaseURL string
}

func openSQL(ctx context.Context, cfg Config) (Backend, error) {
	return nil, errors.New("broker sql: not built yet")
}
