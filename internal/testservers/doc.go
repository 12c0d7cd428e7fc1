// Package testservers starts what Outflow's own tests need beyond the
// database: the shared brokers' URLs and prefixes (Redis, NATS JetStream,
// RabbitMQ, an in-process Kafka), servers of a test's own on free ports
// (redis-server alone, as a replicated pair or a cluster, nats-server alone
// or as a cluster, PgBouncer, a PostgreSQL with wal_level=logical) and a
// TCP proxy a test can cut to simulate an outage.
//
// It is the framework's test infrastructure, kept out of package
// outflowtest so that a service's tests link no broker client they do not
// use; outflowtest is the kit for users' tests.
package testservers

import (
	"crypto/rand"
	"encoding/hex"
)

// randomHex is n random bytes in hex: a name no other test run picks.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
