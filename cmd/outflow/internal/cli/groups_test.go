package cli

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
)

// The forwarder of the outflow command declares the queues of the handlers
// its worker runs, plus --amqp-groups; the backend adds none of its own.
func TestBrokerConfigDeclaresTheWorkersHandlers(t *testing.T) {
	cfg := brokerConfig(config.Config{Broker: "amqp", AMQPGroups: map[string][]string{"refunds": {"ledger"}, "payments": {"audit", "sync-analytics"}}}, 1, nil, true)
	// Each handler's replay topic too (consumer.ReplayTopic).
	require.Equal(t, map[string][]string{
		"payments":                       {"audit", "sync-analytics", "notify-merchant"},
		"refunds":                        {"ledger"},
		"outflow.replay.sync-analytics":  {"sync-analytics"},
		"outflow.replay.notify-merchant": {"notify-merchant"},
	}, cfg.AMQP.Groups)
	require.Equal(t, map[string][]string{
		"payments":                       {"sync-analytics", "notify-merchant"},
		"outflow.replay.sync-analytics":  {"sync-analytics"},
		"outflow.replay.notify-merchant": {"notify-merchant"},
	}, brokerConfig(config.Config{}, 1, nil, true).AMQP.Groups)
}

// On the database of another service (no app tables), the reference app's
// queues are not declared on its broker: only --amqp-groups.
func TestBrokerConfigWithoutTheAppDeclaresOnlyTheGivenGroups(t *testing.T) {
	require.Equal(t, map[string][]string{"refunds": {"ledger"}},
		brokerConfig(config.Config{Broker: "amqp", AMQPGroups: map[string][]string{"refunds": {"ledger"}}}, 1, nil, false).AMQP.Groups)
	require.Empty(t, brokerConfig(config.Config{}, 1, nil, false).AMQP.Groups)
}
