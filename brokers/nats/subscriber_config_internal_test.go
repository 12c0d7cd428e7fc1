package nats

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
)

// unusedJetStream is a JetStream context never called: validate only
// looks at it.
type unusedJetStream struct{ nats.JetStreamContext }

// validate reports every wrong field at once, each named; AckWait
// defaults to the module's one ClaimIdle default.
func TestSubscriberConfigValidate(t *testing.T) {
	t.Parallel()
	stream := func(string) string { return "s" }
	tests := []struct {
		name string
		cfg  SubscriberConfig
		want []string // substrings; none means valid
	}{
		{"defaults", SubscriberConfig{JetStream: unusedJetStream{}, Group: "g", Stream: stream}, nil},
		{"nothing", SubscriberConfig{}, []string{"JetStream: is required", "Group: is required", "Stream: is required"}},
		{"negatives", SubscriberConfig{JetStream: unusedJetStream{}, Group: "g", Stream: stream, BatchSize: -1,
			AckWait: -time.Second, NakDelay: -1, FetchWait: -1, CheckInterval: -1},
			[]string{"BatchSize: must be at least 1", "AckWait: must be positive", "NakDelay: must be positive",
				"FetchWait: must be positive", "CheckInterval: must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.setDefaults()
			err := cfg.validate()
			if tt.want == nil {
				require.NoError(t, err)
				require.Equal(t, brokers.DefaultClaimIdle, cfg.AckWait)
				return
			}
			require.ErrorContains(t, err, "nats subscriber config: ")
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}
