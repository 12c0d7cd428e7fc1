// Package sql is the PostgreSQL-only backend: the forwarder appends to
// watermill-sql message tables and the workers read them with Outflow's own
// subscriber (same schema, same offsets). Importing it registers the backend
// with package brokers, for [brokers.Open] with [brokers.SQL]; it links
// watermill-sql and pgx only.
//
// watermill-sql never deletes a row: the backend is a [brokers.Trimmer],
// which the forwarder process runs. What the backend keeps and lacks is in
// docs/brokers.md.
//
// Lag (brokers.LagReporter) counts the rows of the topic's table past the
// group's (last_processed_transaction_id, offset_acked) in watermill-sql's
// offsets table, the order and position the subscriber reads by; the
// oldest age is the oldest created_at among them. The subscriber moves the
// position once per read, after the longest acked prefix, so rows of a
// read in progress count until it ends; rows of transactions not committed
// yet are not seen. A group without a position lags by the whole table; a
// table not created yet, by nothing. Lag runs one count and creates no
// table and no position; its cost grows with the backlog it counts.
package sql
