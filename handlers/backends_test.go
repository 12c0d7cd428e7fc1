package handlers_test

// The end-to-end tests run on every backend.
import _ "github.com/outflow-dev/outflow/brokers/all"
