// Package outflowtest helps tests, ours and our users', run against real
// PostgreSQL in isolation.
//
// [NewSchema] creates a fresh schema in the test database, applies the
// framework's migrations and then the service's own sets given to it
// (NewSchema(t, mymigrations.Set())), and returns a pool whose search_path
// points at it, so tests run in parallel and re-run clean. The test database URL comes from
// OUTFLOW_TEST_DATABASE_URL and defaults to
// postgres://postgres@127.0.0.1:5432/outflow_test?sslmode=disable; the
// database is created if it does not exist. A database that cannot be
// reached fails the test with a message saying how to start one: tests never
// skip silently.
package outflowtest
