// Package all links every built-in backend: import it for its side effect
// in a program that lets its configuration choose the broker (the outflow
// command does). A service that uses one broker imports that backend's
// package instead and links no other client.
package all

import (
	_ "github.com/outflow-dev/outflow/brokers/amqp"
	_ "github.com/outflow-dev/outflow/brokers/kafka"
	_ "github.com/outflow-dev/outflow/brokers/nats"
	_ "github.com/outflow-dev/outflow/brokers/redis"
	_ "github.com/outflow-dev/outflow/brokers/sql"
)
