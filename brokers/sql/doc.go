// Package sql is the PostgreSQL-only backend: the forwarder appends to
// watermill-sql message tables and the workers read them with Outflow's own
// subscriber (same schema, same offsets). Importing it registers the backend
// with package brokers, for [brokers.Open] with [brokers.SQL]; it links
// watermill-sql and pgx only.
//
// watermill-sql never deletes a row: the backend is a [brokers.Trimmer],
// which the forwarder process runs. What the backend keeps and lacks is in
// docs/brokers.md.
package sql
