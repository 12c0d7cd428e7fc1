package cli

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The reference app is installed where its set's version table records
// an applied version, or, before that table exists, where the single-set
// releases' table records one of the app's versions; never because a
// table has one of the app's names. Where it is not, RabbitMQ declares
// only --amqp-groups' queues.
func TestAppInstalledByItsVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	installed := func(s *outflowtest.Schema) bool {
		t.Helper()
		ok, err := appInstalled(ctx, s.Pool)
		require.NoError(t, err)
		return ok
	}
	amqp := config.Config{Broker: "amqp", AMQPGroups: map[string][]string{"refunds": {"ledger"}}}

	// A service's own webhook_deliveries and api_keys.
	own := outflowtest.NewSchema(t)
	_, err := own.Pool.Exec(ctx, `CREATE TABLE webhook_deliveries (endpoint text); CREATE TABLE api_keys (name text)`)
	require.NoError(t, err)
	require.False(t, installed(own))
	require.Equal(t, map[string][]string{"refunds": {"ledger"}}, brokerConfig(amqp, 1, nil, installed(own)).AMQP.Groups,
		"none of the app's queues")

	app := outflowtest.NewSchema(t, appmigrations.Sets()...)
	require.True(t, installed(app))
	require.Contains(t, brokerConfig(amqp, 1, nil, installed(app)).AMQP.Groups, "payments")

	// The app's set rolled back to nothing: its version table holds only
	// goose's version 0.
	empty := outflowtest.NewSchema(t)
	_, err = empty.Pool.Exec(ctx, `CREATE TABLE `+appmigrations.VersionTable+` (id serial, version_id bigint, is_applied bool, tstamp timestamp);
		INSERT INTO `+appmigrations.VersionTable+` (version_id, is_applied) VALUES (0, true)`)
	require.NoError(t, err)
	require.False(t, installed(empty))

	// A database of the single-set releases, not yet migrated by this one:
	// with the app's versions, and with the framework's alone.
	for _, tt := range []struct {
		versions string
		want     bool
	}{{"(0), (1), (2), (4)", true}, {"(0), (1), (4)", false}} {
		legacy := outflowtest.NewEmptySchema(t)
		_, err := legacy.Pool.Exec(ctx, `CREATE TABLE `+migrations.LegacyVersionTable+` (id serial, version_id bigint, is_applied bool DEFAULT true, tstamp timestamp);
			INSERT INTO `+migrations.LegacyVersionTable+` (version_id) VALUES `+tt.versions)
		require.NoError(t, err)
		require.Equal(t, tt.want, installed(legacy), tt.versions)
	}
}
