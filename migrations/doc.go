// Package migrations holds Outflow's own versioned SQL schema, embedded in
// the binary, and the Migrator that applies it: the outbox, the forwarder's
// state (outbox_partitions, outbox_forwarders), and the consumers'
// bookkeeping (consumer_aggregate_versions, dead_letters, the
// consumer_blocked function, and processed_messages, no longer written
// since 00026). Nothing of any service:
// a service keeps its own tables in a set of its own ([Set]), applied after
// this one by the same machinery, with its own version table (the
// reference app's is package app/migrations).
//
// Call [Up] from your own start-up, or run `outflow migrate up`; or, for a
// schema of its own, [New] with [Config].Schema:
//
//	m, err := migrations.New(db, migrations.Config{Schema: "outflow"})
//	...
//	_, err = m.Up(ctx) // creates the schema if missing
//
// A service with a set of its own applies both in one call, from its pgx
// pool ([UpSetsPool]) or a *sql.DB ([UpSets]), the framework's first:
//
//	_, err := migrations.UpSetsPool(ctx, pool, migrations.Config{}, migrations.Framework(), refunds.Set())
//
// Running it twice is a no-op. Concurrent runs against the same schema
// serialize on a PostgreSQL advisory lock keyed by the schema's name, so
// two processes starting together do not race, while tests migrating
// separate schemas in parallel do not wait for each other.
//
// # Where the tables are
//
// Without Config.Schema, everything goes into the first schema of the
// connection's search_path (current_schema()). With it, into that schema,
// whatever the connection's search_path. The runtime packages
// (events/outbox, forwarder, idempotency, consumer) qualify no table name:
// they find the tables through the search_path of their own connections,
// so give those the schema, e.g. ?search_path=outflow in the database URL
// (a service whose own tables are elsewhere lists both:
// search_path=app,outflow).
//
// # Upgrading from a single-set release
//
// Releases before the split kept the framework's and the reference app's
// migrations in one set, recorded in outflow_schema_migrations
// ([LegacyVersionTable]). The sets keep those version numbers (the
// framework's are 00001, 00004, 00005, 00008, 00010 and 00011; the app's
// 00002, 00003, 00006, 00007 and 00009), and each adopts them
// ([Set.AdoptFrom]): the first run of a set on such a database creates its
// own version table holding the versions the old table lists, under the
// lock, then applies only what is missing. A database the old release
// migrated completely or only part way upgrades with the next `outflow
// migrate up --set app` (or [UpSets] of [Framework] and the app's sets,
// app/migrations.Sets),
// with no data touched and no manual step. outflow_schema_migrations is left as it was, so that an
// instance of the old release starting during the rollout finds its
// migrations applied; drop it once none is left. A service built on the
// old release keeps the reference app's tables it was given (merchants,
// payments, ledger_*, idempotency_keys, merchant_stats_daily, webhook_*):
// nothing drops them, and nothing manages them any more.
package migrations
