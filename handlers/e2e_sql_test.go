package handlers_test

import (
	"testing"
	"time"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The sql backend's message and offsets tables live in a schema of their
// own (the URL's search_path), dropped when the test ends. Polls every
// 20 ms; the ack deadline is the worker's ClaimIdle (1 s here), so the
// second worker takes over as soon as the first has rolled back or
// committed its batch.
func init() {
	backends = append(backends, testBackend{brokers.SQL, func(t *testing.T) brokers.Backend {
		s := outflowtest.NewEmptySchema(t)
		return openBackend(t, brokers.Config{Kind: brokers.SQL,
			SQL: brokers.SQLConfig{DatabaseURL: s.URL, TablePrefix: "outflow_", PollInterval: 20 * time.Millisecond}})
	}})
}
