package brokers

import "context"

// Pinger is implemented by a [Backend] that can tell, cheaply, whether its
// broker answers now: a readiness probe calls Ping with a short deadline,
// which Ping honours. Every built-in backend implements it (redis PING,
// nats JetStream account info, amqp a channel opened and closed, kafka
// cluster metadata, sql a database ping); for a backend of one's own that
// does not, a probe reports the broker as unknown.
type Pinger interface {
	Ping(ctx context.Context) error
}
