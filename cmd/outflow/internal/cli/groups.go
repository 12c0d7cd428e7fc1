package cli

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/handlers"
)

// referenceHandlers are the handlers `outflow worker` runs.
func referenceHandlers(pool *pgxpool.Pool, notify handlers.NotifyConfig) []consumer.Handler {
	return []consumer.Handler{handlers.SyncAnalytics(), handlers.NotifyMerchant(pool, notify)}
}

// brokerConfig is the configuration's broker block, with, for RabbitMQ and
// where the reference app's tables are installed (app), the groups of the
// handlers `outflow worker` runs added to --amqp-groups: the forwarder
// declares their queues before its first publish, so nothing is dropped
// before their first worker subscribes. On another service's database the
// app's queues are not declared: --amqp-groups lists that service's. The
// backend itself declares no group of its own.
func brokerConfig(c config.Config, partitions int, logger *slog.Logger, app bool) brokers.Config {
	cfg := c.BrokerConfig(partitions, logger)
	cfg.AMQP.Groups = mergeGroups(c.AMQPGroups, nil)
	if app {
		cfg.AMQP.Groups = mergeGroups(c.AMQPGroups, consumer.HandlerGroups(referenceHandlers(nil, handlers.NotifyConfig{})...))
	}
	return cfg
}

// mergeGroups is the union of a and b, per topic, a's groups first.
func mergeGroups(a, b map[string][]string) map[string][]string {
	out := map[string][]string{}
	for _, m := range []map[string][]string{a, b} {
		for topic, groups := range m {
			for _, g := range groups {
				if !slices.Contains(out[topic], g) {
					out[topic] = append(out[topic], g)
				}
			}
		}
	}
	return out
}

// appTable is the reference app's table every app-specific read of the
// tool needs (webhook deliveries: stats, the console's journey, the
// reference consumers' work): where it is missing, the database is another
// service's, and the tool shows the framework's state alone.
const appTable = "webhook_deliveries"

// appInstalled says whether the reference app's tables are on the pool's
// search_path.
func appInstalled(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, appTable).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for the reference app's tables (%s): %w", appTable, err)
	}
	return ok, nil
}
