package brokers_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
)

// Open reports every wrong field at once, each named, before it looks for
// the backend.
func TestOpenReportsEveryConfigError(t *testing.T) {
	t.Parallel()
	_, err := brokers.Open(context.Background(), brokers.Config{Kind: "none", StreamPartitions: 2000,
		CloudEvents: cloudevents.Config{Source: "not a uri"}})
	want := "broker config: StreamPartitions: must be between 1 and 1024\n"
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, cloudevents.ErrInvalidConfig) {
		t.Fatalf("Open = %v, want %q then the CloudEvents Source's error", err, want)
	}
}
