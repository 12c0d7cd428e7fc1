package redis

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/configcheck/configchecktest"
)

// validate reports every wrong field at once, each named; ClaimIdle
// defaults to the one default of the module.
func TestSubscriberConfigValidate(t *testing.T) {
	t.Parallel()
	client := goredis.NewClient(&goredis.Options{}) // never used: validate only looks at it
	t.Cleanup(func() { _ = client.Close() })
	configchecktest.Run(t, "redis subscriber config", []configchecktest.Case[SubscriberConfig]{
		configchecktest.Valid("defaults", SubscriberConfig{Client: client, ConsumerGroup: "g", Consumer: "c"}),
		configchecktest.Invalid("nothing", SubscriberConfig{},
			"Client: is required", "ConsumerGroup: is required", "Consumer: is required"),
		configchecktest.Invalid("negatives", SubscriberConfig{Client: client, ConsumerGroup: "g", Consumer: "c", BatchSize: -1, BlockTime: -1,
			ClaimIdle: -time.Second, ClaimInterval: -1, NackResendSleep: -1},
			"BatchSize: must be at least 1", "BlockTime: must not be negative", "ClaimIdle: must not be negative",
			"ClaimInterval: must not be negative", "NackResendSleep: must not be negative"),
	}, func(c *SubscriberConfig) error { c.setDefaults(); return c.validate() },
		func(t *testing.T, cfg SubscriberConfig) { require.Equal(t, brokers.DefaultClaimIdle, cfg.ClaimIdle) })
}

// The broker's Config: every wrong field at once, each named.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	client := goredis.NewClient(&goredis.Options{}) // never used: validate only looks at it
	t.Cleanup(func() { _ = client.Close() })
	configchecktest.Run(t, "redis broker config", []configchecktest.Case[Config]{
		configchecktest.Valid("defaults", Config{Client: client}),
		configchecktest.Valid("replicas take the default wait", Config{Client: client, WaitReplicas: 1}),
		configchecktest.Invalid("nothing", Config{StreamPartitions: 2000},
			"Client: is required", "StreamPartitions: must be between 1 and 1024"),
		configchecktest.Invalid("negatives", Config{Client: client, StreamPartitions: -1, WaitReplicas: -1, WaitTimeout: -1, MaxFieldBytes: -1},
			"StreamPartitions: must be between 1 and 1024", "WaitReplicas: must not be negative", "WaitTimeout: must be between 0 and 1m", "MaxFieldBytes: must not be negative"),
		configchecktest.Invalid("wait too long", Config{Client: client, WaitReplicas: 1, WaitTimeout: time.Hour}, "WaitTimeout: must be between 0 and 1m"),
	}, func(c *Config) error { c.setDefaults(); return c.validate() },
		func(t *testing.T, cfg Config) {
			require.Equal(t, 1, cfg.StreamPartitions)
			require.Equal(t, DefaultMaxFieldBytes, cfg.MaxFieldBytes)
			if cfg.WaitReplicas > 0 {
				require.Equal(t, DefaultWaitTimeout, cfg.WaitTimeout)
			}
		})
}
