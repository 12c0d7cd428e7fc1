package redis

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
)

// validate reports every wrong field at once, each named; ClaimIdle
// defaults to the one default of the module.
func TestSubscriberConfigValidate(t *testing.T) {
	t.Parallel()
	client := goredis.NewClient(&goredis.Options{}) // never used: validate only looks at it
	t.Cleanup(func() { _ = client.Close() })
	tests := []struct {
		name string
		cfg  SubscriberConfig
		want []string // substrings; none means valid
	}{
		{"defaults", SubscriberConfig{Client: client, ConsumerGroup: "g", Consumer: "c"}, nil},
		{"nothing", SubscriberConfig{}, []string{"Client: is required", "ConsumerGroup: is required", "Consumer: is required"}},
		{"negatives", SubscriberConfig{Client: client, ConsumerGroup: "g", Consumer: "c", BatchSize: -1, BlockTime: -1,
			ClaimIdle: -time.Second, ClaimInterval: -1, NackResendSleep: -1},
			[]string{"BatchSize: must be at least 1", "BlockTime: must not be negative", "ClaimIdle: must not be negative",
				"ClaimInterval: must not be negative", "NackResendSleep: must not be negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.setDefaults()
			err := cfg.validate()
			if tt.want == nil {
				require.NoError(t, err)
				require.Equal(t, brokers.DefaultClaimIdle, cfg.ClaimIdle)
				return
			}
			require.ErrorContains(t, err, "redis subscriber config: ")
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

// The broker's Config: every wrong field at once, each named.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	client := goredis.NewClient(&goredis.Options{}) // never used: validate only looks at it
	t.Cleanup(func() { _ = client.Close() })
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings; none means valid
	}{
		{"defaults", Config{Client: client}, nil},
		{"replicas take the default wait", Config{Client: client, WaitReplicas: 1}, nil},
		{"nothing", Config{StreamPartitions: 2000}, []string{"Client: is required", "StreamPartitions: must be between 1 and 1024"}},
		{"negatives", Config{Client: client, StreamPartitions: -1, WaitReplicas: -1, WaitTimeout: -1, MaxFieldBytes: -1},
			[]string{"StreamPartitions: must be between 1 and 1024", "WaitReplicas: must not be negative",
				"WaitTimeout: must be between 0 and 1m", "MaxFieldBytes: must not be negative"}},
		{"wait too long", Config{Client: client, WaitReplicas: 1, WaitTimeout: time.Hour}, []string{"WaitTimeout: must be between 0 and 1m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.setDefaults()
			err := cfg.validate()
			if tt.want == nil {
				require.NoError(t, err)
				require.Equal(t, 1, cfg.StreamPartitions)
				require.Equal(t, DefaultMaxFieldBytes, cfg.MaxFieldBytes)
				if cfg.WaitReplicas > 0 {
					require.Equal(t, DefaultWaitTimeout, cfg.WaitTimeout)
				}
				return
			}
			require.ErrorContains(t, err, "redis broker config: ")
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}
