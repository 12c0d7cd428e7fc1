package cli

// The outflow command lets --broker choose the backend, so it links them all.
import _ "github.com/outflow-dev/outflow/brokers/all"
