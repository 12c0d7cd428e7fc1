package consumer

// Redis is the Worker's default broker (Config.RedisURL, when Config.Broker
// is nil), so the Worker links the redis backend, and no other: a Worker on
// another broker is given a Backend opened by the caller, which imports
// that backend's package.
import _ "github.com/outflow-dev/outflow/brokers/redis"
