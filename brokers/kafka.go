package brokers

import (
	"context"
	"errors"
)

// KafkaConfig is the kafka block.
type KafkaConfig struct {
	Brokers []string
}

func openKafka(ctx context.Context, cfg Config) (Backend, error) {
	return nil, errors.New("broker kafka: not built yet")
}
