// Package migrations holds Outflow's versioned SQL schema, embedded in the
// binary, and the functions that apply it.
//
// Call [Up] from your own start-up, or run `outflow migrate up`. Running it
// twice is a no-op. Concurrent runs against the same schema serialize on a
// PostgreSQL advisory lock keyed by the schema name, so two processes
// starting together do not race, while tests migrating separate schemas in
// parallel do not wait for each other.
//
// Everything is created in the first schema of the connection's search_path,
// so a service can keep Outflow's tables in a schema of its own by setting
// search_path in the connection URL.
package migrations
