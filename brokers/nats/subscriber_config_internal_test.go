package nats

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/configcheck/configchecktest"
)

// unusedJetStream is a JetStream context never called: validate only
// looks at it.
type unusedJetStream struct{ nats.JetStreamContext }

// validate reports every wrong field at once, each named; AckWait
// defaults to the module's one ClaimIdle default.
func TestSubscriberConfigValidate(t *testing.T) {
	t.Parallel()
	stream := func(string) string { return "s" }
	configchecktest.Run(t, "nats subscriber config", []configchecktest.Case[SubscriberConfig]{
		configchecktest.Valid("defaults", SubscriberConfig{JetStream: unusedJetStream{}, Group: "g", Stream: stream}),
		configchecktest.Invalid("nothing", SubscriberConfig{},
			"JetStream: is required", "Group: is required", "Stream: is required"),
		configchecktest.Invalid("negatives", SubscriberConfig{JetStream: unusedJetStream{}, Group: "g", Stream: stream, BatchSize: -1,
			AckWait: -time.Second, NakDelay: -1, FetchWait: -1, CheckInterval: -1},
			"BatchSize: must be at least 1", "AckWait: must be positive", "NakDelay: must be positive", "FetchWait: must be positive", "CheckInterval: must be positive"),
	}, func(c *SubscriberConfig) error { c.setDefaults(); return c.validate() },
		func(t *testing.T, cfg SubscriberConfig) { require.Equal(t, brokers.DefaultClaimIdle, cfg.AckWait) })
}
