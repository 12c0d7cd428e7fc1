package cli

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/migrations"
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

// appInstalled says whether the reference app's set is installed in the
// pool's search_path: its version table (app_schema_migrations) records an
// applied version, or, where that table is not yet created (a database
// migrated by the single-set releases), their version table
// (outflow_schema_migrations) records one of the app's versions. Never by
// one of the app's table names: a service may well have a webhook_deliveries
// or an api_keys of its own, and the tool would read it as the app's.
// Every app-specific behaviour of the tool (stats' webhooks, the console's
// login and pages, the reference consumers' queues, the payments API)
// asks this.
func appInstalled(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var haveApp, haveLegacy bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		appmigrations.VersionTable, migrations.LegacyVersionTable).Scan(&haveApp, &haveLegacy); err != nil {
		return false, fmt.Errorf("look for the reference app's version table: %w", err)
	}
	var installed bool
	switch {
	case haveApp:
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{appmigrations.VersionTable}.Sanitize()+
			` WHERE version_id > 0 AND is_applied)`).Scan(&installed); err != nil {
			return false, fmt.Errorf("read the reference app's version table %s: %w", appmigrations.VersionTable, err)
		}
	case haveLegacy:
		versions, err := appVersions()
		if err != nil {
			return false, err
		}
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{migrations.LegacyVersionTable}.Sanitize()+
			` WHERE version_id = ANY($1) AND is_applied)`, versions).Scan(&installed); err != nil {
			return false, fmt.Errorf("read the single-set releases' version table %s: %w", migrations.LegacyVersionTable, err)
		}
	}
	return installed, nil
}

// appNotInstalled is why appInstalled said no, for the errors that need it.
var appNotInstalled = fmt.Sprintf("no version of the app's set applied: %s, or %s of an earlier release, records none",
	appmigrations.VersionTable, migrations.LegacyVersionTable)

// appVersions are the versions of the reference app's migrations.
func appVersions() ([]int64, error) {
	files, err := fs.Glob(appmigrations.Set().FS, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []int64
	for _, f := range files {
		num, _, _ := strings.Cut(f, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("the reference app's migration %s: no version: %w", f, err)
		}
		out = append(out, v)
	}
	return out, nil
}
