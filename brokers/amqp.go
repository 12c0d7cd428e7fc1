package brokers

import (
	"context"
	"errors"
)

// AMQPConfig is the amqp block.
type AMQPConfig struct {
	URL string
}

func openAMQP(ctx context.Context, cfg Config) (Backend, error) {
	return nil, errors.New("broker amqp: not built yet")
}
