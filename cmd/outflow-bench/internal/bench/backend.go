package bench

import (
	"context"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/redis" // the benchmarks' broker
)

// redisBackend opens the workers' broker: Redis at url, one partition, no
// prefix, the streams the benchmarks' forwarders publish to. The caller
// closes it after the worker stopped.
func redisBackend(ctx context.Context, url string) (brokers.Backend, error) {
	return brokers.Open(ctx, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: url}, Logger: quietLogger()})
}
