package brokers

import "context"

// Pinger is implemented by a [Backend] that can tell, cheaply, whether its
// broker answers now: a readiness probe calls Ping with a short deadline.
// The redis and sql backends implement it; for the others a probe cannot
// tell and reports the broker as unknown (their clients reconnect on their
// own, and the forwarder counts what fails to publish).
type Pinger interface {
	Ping(ctx context.Context) error
}
